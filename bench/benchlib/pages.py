"""Benchmark pages: the real vLLM 0.32 page from the fixtures, and large pages built from it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REAL_DIR = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu-ngram"


def real_pages() -> list[str]:
    """The 49 recorded pages of one vLLM 0.32 server, in capture order (about 55 KB each)."""
    files = sorted(REAL_DIR.glob("snap_*.prom"), key=lambda p: int(p.stem.split("_")[1]))
    return [p.read_text() for p in files]


def real_page() -> str:
    """The last recorded page (the largest: every histogram bucket populated)."""
    return real_pages()[-1]


def multiply(page: str, models: int, engines: int) -> str:
    """The page of a server with ``models`` models x ``engines`` data-parallel engines: every
    series of the recorded model is repeated for each (model, engine) pair, families keep
    their HELP/TYPE lines once (the layout vLLM and prometheus_client write)."""
    out = []
    for line in page.split("\n"):
        if line.startswith("#") or 'model_name="tiny-llama"' not in line:
            out.append(line)
            continue
        for m in range(models):
            for e in range(engines):
                out.append(line.replace('model_name="tiny-llama"', f'model_name="org/model-{m}"')
                           .replace('engine="0"', f'engine="{e}"'))
    return "\n".join(out)


def big_page(target_bytes: int = 2_000_000) -> tuple[str, int, int]:
    """(page, models, engines): the real page grown past ``target_bytes`` with 4 engines
    per model and as many models as needed."""
    base = real_page()
    engines = 4
    models = 1
    while True:
        page = multiply(base, models, engines)
        if len(page.encode()) >= target_bytes:
            return page, models, engines
        models += 1
