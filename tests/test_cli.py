"""The `specwatch` dispatcher: unknown commands and bare invocations fail with exit 2."""

from specwatch.cli import main


def test_unknown_command_exits_2(capsys):
    assert main(["no-such-command"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_no_command_prints_usage_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: specwatch" in capsys.readouterr().out


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "commands:" in capsys.readouterr().out


def test_every_command_has_its_module_in_the_cli_package():
    """One home per command: its options and its run live in ``specwatch.cli.<module>``
    (the layers below take typed inputs; import-linter forbids them argparse)."""
    import importlib

    from specwatch.cli import COMMANDS

    for name, (module, _) in COMMANDS.items():
        assert module.startswith("specwatch.cli."), name
        loaded = importlib.import_module(module)
        assert callable(loaded.add_arguments) and callable(loaded.run), name
