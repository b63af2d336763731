"""`retriever` console script: wires typer commands to the library and turns user errors into one line."""

from __future__ import annotations

import difflib
import importlib
import inspect
import shlex
import sys
import typing
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import interrupts, options
from retriever import __version__
from retriever.errors import RetrieverError, shortened_words
from retriever.text import check_argument, counted, terminal_safe

app = typer.Typer(
    help="Vector search over a calibrated index (BERT-flow): encode, build, search, bench.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    suggest_commands=False,  # ours: `_usage_message`
)
# Commands that delete: suggested for a mistyped command only where it is close to one (`remov`), not merely alike
# (`rename` was answered "Did you mean 'remove'?").
DELETING = frozenset({"remove"})


def _version(value: bool) -> None:
    if value:
        typer.echo(f"retriever {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="show the version and exit")
    ] = None,
) -> None:
    """Vector search over a calibrated index (BERT-flow): encode, build, search, bench."""


@app.command()
@interrupts.interruptible
def encode(
    file: Annotated[Path, typer.Argument(help="corpus: .txt (one text per line), BEIR .jsonl, .csv/.tsv, or .gz of them")],
    out: Annotated[Path, typer.Option("--out", "-o", help="where to write the float32 .npy matrix")],
    model: options.Model = None,
    pooling: options.Pooling = "last-avg",
    layers: options.Layers = None,
    max_length: options.MaxLength = None,
    device: options.Device = "auto",
    dtype: options.Dtype = "fp32",
    batch_size: options.BatchSize = None,
    runtime: options.Runtime = "auto",
    encoding: options.Encoding = "utf-8",
) -> None:
    """Encode FILE into a (documents x dim) float32 .npy, row i for document i.

    Each document is encoded exactly as `build` encodes it (title and text), so OUT feeds `retriever build FILE
    --vectors OUT`; the record beside it (vectors.json for vectors.npy) names the encoder. Streamed in chunks: an
    interrupted run resumes when re-run."""
    from retriever.encode.model_card import encoder_for
    from retriever.engines.stages import count_documents, encode_corpus
    from retriever.progress import stderr_console

    if out.suffix != ".npy":
        raise RetrieverError(f"--out must end in .npy (got {out})")
    total = count_documents(file, encoding)  # a bad corpus fails here, before the model loads
    # From the kit an earlier run kept, where the encoder would run on ONNX Runtime on the CPU: no model loaded.
    encoder = encoder_for(model, pooling, layers, max_length, device, dtype, batch_size, runtime=runtime)
    interrupts.on_interrupt(f"{out} is incomplete; re-run the same command to resume")
    result = encode_corpus(file, out, encoder, encoding=encoding, total=total, progress=True)
    truncated = (f", {counted(result.truncated, 'text')} truncated at {encoder.max_length} tokens"
                 if result.truncated else "")  # a count of none is no news
    stderr_console.print(f"wrote {out} ({result.count:,} x {encoder.dim}){truncated}", markup=False, highlight=False)


# The index and bench commands live in their own modules; registered after `encode`, in workflow order.
from cli import index_commands  # noqa: E402
from cli.bench import bench  # noqa: E402

for command_name, command in (*index_commands.COMMANDS, ("bench", bench)):
    app.command(command_name)(interrupts.interruptible(command))

from cli.serve import mcp, serve  # noqa: E402

app.command()(serve)
app.command()(mcp)


def _say_waiting(name: str, holder: str) -> None:
    print(f"waiting: index '{name}' is being written by {holder}; this write goes next", file=sys.stderr, flush=True)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {terminal_safe(str(message))}", file=sys.stderr)  # the advice, not our source line


def _check_arguments(arguments: list[str]) -> None:
    """Refuse an argument with bytes the locale cannot decode (`retriever search $'\\xff'`) before any command
    runs: Python keeps them as lone surrogates, which a tokenizer, SQLite or stdout would fail on mid-command."""
    for number, argument in enumerate(arguments, start=1):
        check_argument(argument, number)


def _replace_unencodable() -> None:
    """Where stdout or stderr cannot encode every character (PYTHONIOENCODING=ascii, a legacy console code page),
    print a document's "é" as \\xe9 instead of failing with a traceback halfway through a table."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _one_line(message: str) -> str:
    """An error message as one safe line: it may quote stored or typed text, with control characters or a
    newline in it, or a path or value thousands of characters long (shown by its start and end)."""
    return shortened_words(terminal_safe(message).replace("\n", "\\n"))


# click's exception classes, or typer's own copy of them (typer 0.2x carries click inside): typer.BadParameter is
# their one public name in every typer.
_clicks = importlib.import_module(typer.BadParameter.__module__)


def _usage_message(error) -> str:
    """A usage error (what click would show in a usage box) as one line: a bad value names the option and what it
    takes; anything else (an unknown option, a missing argument) points at the command's --help."""
    param = getattr(error, "param", None)
    if isinstance(error, typer.BadParameter) and param is not None and not isinstance(error, _clicks.MissingParameter):
        flag = _flag(param)
        takes, given = _takes(param), _given(error)
        if takes is not None and given is not None:
            return f"invalid value for {flag}: {given!r} is not {takes}"
        return f"invalid value for {flag}: {_sentence(error.message)}"  # our parsers say what they take
    ctx = getattr(error, "ctx", None)
    run = _command_run(sys.argv[1:])
    if ctx is not None:
        command = ctx.command_path
    else:  # click's parser raises some (an option without its value) before any context is made
        command = "retriever" + (f" {run.name}" if run is not None else "")
    named = getattr(error, "option_name", "") or ""
    given = next((argument for argument in sys.argv[1:] if argument.startswith(named)), named) if named else ""
    if isinstance(error, _clicks.NoSuchOption) and run is not None and any(
            param.param_type_name == "argument" for param in run.params) and (" " in given or named[1:2].isdigit()):
        # a query or a path that starts with '-' ("-5 degrees") reads as an option: after '--' it is an argument
        return (f"{_sentence(error.format_message())}: an argument that starts with '-' goes last, after '--' "
                f"({command} [OPTIONS] -- {shlex.quote(given)})")
    message = _sentence(error.format_message())
    commands = ctx.command.commands if ctx is not None and isinstance(getattr(ctx.command, "commands", None), dict) \
        else {}
    typed = next((argument for argument in sys.argv[1:] if not argument.startswith("-")), "")
    if commands and typed and typed not in commands and message.startswith("no such command"):
        close = difflib.get_close_matches(typed, [name for name in commands if name not in DELETING])
        close += difflib.get_close_matches(typed, sorted(DELETING), cutoff=0.8)
        if close:
            message += f". Did you mean {', '.join(map(repr, close))}?"
    return f"{message} (see {command} --help)"


def _flag(param) -> str:
    """How the user wrote PARAM: an option's long flag, an argument's name."""
    if param.param_type_name != "option":
        return param.name.upper()
    return next((spelling for spelling in param.opts if spelling.startswith("--")), param.opts[0])


def _takes(param) -> str | None:
    """What a number option takes, in words with its bounds ("a whole number from 1 to 10000"); None for any
    other kind, whose own message says it."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    kinds = {kind for kind in (annotation, *typing.get_args(annotation)) if kind in (int, float)}
    if len(kinds) != 1:
        return None
    words = "a whole number" if kinds == {int} else "a number"
    low, high = (getattr(param, bound, None) for bound in ("min", "max"))
    if low is not None and high is not None:
        return f"{words} from {_number(low)} to {_number(high)}"
    if low is not None:
        return f"{words} of at least {_number(low)}"
    if high is not None:
        return f"{words} of at most {_number(high)}"
    return words


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _given(error) -> str | None:
    """The value as typed that typer's conversion refused: its validation error keeps it, the message does not."""
    found = getattr(error.__cause__, "errors", None)
    problems = found() if callable(found) else []
    return str(problems[0]["input"]) if problems and "input" in problems[0] else None


def _sentence(message: str) -> str:
    """click's wording as a clause of our line: "No such option: --x." -> "no such option: --x"."""
    message = message.strip().rstrip(".").replace("(Possible options:", "(possible options:")
    return message[:1].lower() + message[1:]


def _command_run(arguments: list[str]):
    """The command ARGUMENTS run (the first argument naming one, as a click command), or None."""
    group = typer.main.get_command(app)
    return next((group.commands[argument] for argument in arguments if argument in group.commands), None)


def _flag_names(arguments: list[str]) -> dict[str, str]:
    """The flags of the command ARGUMENTS run, to word its errors with."""
    command = _command_run(arguments)
    return options.flag_names(command) if command is not None else {}


def _command():
    """`app` as its click command, with on/off flags shown bare in --help (typer would show `--json <bool>`)."""
    group = typer.main.get_command(app)
    for command in (group, *getattr(group, "commands", {}).values()):
        if command.help:
            command.help = _reflowed(command.help)
        for param in command.params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        command.get_help_option = _bare_help_option(command.get_help_option)  # --help is made when asked for
    return group


def _reflowed(text: str) -> str:
    """TEXT (a docstring) with each paragraph on one line, for --help to wrap at the terminal's width: typer keeps a
    docstring's own line breaks, which at any other width leave ragged lines."""
    return "\n\n".join(" ".join(paragraph.split("\n")) for paragraph in inspect.cleandoc(text).split("\n\n"))


def _bare_help_option(make):
    def help_option(ctx):
        option = make(ctx)
        if option is not None:
            option.metavar = ""
        return option
    return help_option


def main() -> None:
    """Console-script entry: user errors become one line on stderr and exit code 1, never a traceback; usage
    errors (a bad value, an unknown option) one line and exit code 2, as click gives them; Ctrl-C one line saying
    what it left behind, exit code 130."""
    warnings.showwarning = _show_warning
    _replace_unencodable()
    interrupts.on_terminate()
    from retriever.versions.folder import LOCK_WAIT_NOTICES

    if _say_waiting not in LOCK_WAIT_NOTICES:  # once: tests run many commands in one process
        LOCK_WAIT_NOTICES.append(_say_waiting)
    try:
        _check_arguments(sys.argv[1:])
        # Not standalone: a usage error comes here to be worded as one line, not drawn as typer's usage box; an
        # exit (--help, --version, typer.Exit(1)) comes back as its code. "retriever", as the messages spell it,
        # whether run as the console script or `python -m cli.main`.
        code = _command().main(prog_name="retriever", standalone_mode=False)
    except _clicks.UsageError as error:
        if isinstance(error, getattr(_clicks, "NoArgsIsHelpError", ())):  # no command: the help, as typer shows it
            if error.format_message().strip():  # else rich printed it already
                error.show()
        else:
            print(f"error: {_one_line(_usage_message(error))}", file=sys.stderr)
        sys.exit(error.exit_code)
    except typer.Abort:  # Ctrl-C or end of input at a question a command asked
        print("error: aborted", file=sys.stderr)
        sys.exit(1)
    except RetrieverError as error:  # worded with the flags of the command run: --fit-sample, not fit_sample
        print(f"error: {_one_line(error.render(_flag_names(sys.argv[1:])))}", file=sys.stderr)
        sys.exit(1)
    except (interrupts.Interrupted, KeyboardInterrupt) as interrupted:
        print(interrupts.message(interrupted), file=sys.stderr)
        sys.exit(143 if interrupts.terminated(interrupted) else 130)
    except OSError as error:  # the last guard: a file problem the library did not word itself
        where = f": {error.filename}" if error.filename is not None else ""
        print(f"error: {_one_line(f'{error.strerror or error}{where}')}", file=sys.stderr)
        sys.exit(1)
    if code == 130:  # typer's own answer to a Ctrl-C outside a command's body (parsing its arguments): said too
        print(interrupts.message(), file=sys.stderr)
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
