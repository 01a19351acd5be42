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
