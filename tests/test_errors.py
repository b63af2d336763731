"""Errors carry what went wrong as data: the library names a parameter the Python way, the CLI with its flags, the
server with `code` and `parameter` in its JSON body."""

from __future__ import annotations

import pickle

import pytest
import typer.main

from retriever.errors import (ConflictError, DamagedIndexError, NotFoundError, Param, RetrieverError,
                              UnavailableError, param)
from tests.helpers import assert_one_line_error


def test_a_parameter_is_spelled_by_whoever_reads_the_message():
    error = RetrieverError(f"the onnx runtime runs on the CPU; use {param('runtime', 'torch')} on a GPU")
    assert str(error) == "the onnx runtime runs on the CPU; use runtime='torch' on a GPU"
    assert error.render({"runtime": "--runtime"}) == "the onnx runtime runs on the CPU; use --runtime torch on a GPU"
    assert error.render({"runtime": "runtime"}, between="=").endswith("use runtime=torch on a GPU")
    assert error.parameter == "runtime" and error.parameters == (Param("runtime", "torch"),)
    assert error.code == "bad_input" and error.args == (str(error),)


def test_a_switch_a_missing_name_and_an_explicit_parameter():
    error = RetrieverError(f"pass {param('allow_without_key', True)} or {param('folder', None)} or {param('seed')}",
                           parameter="api_key")
    assert str(error) == "pass allow_without_key=True or folder=None or seed"
    names = {"allow_without_key=True": "--no-key", "folder=None": "--no-cache"}
    assert error.render(names) == "pass --no-key or --no-cache or seed"  # seed: no flag given, the Python name
    assert error.parameter == "api_key" and RetrieverError("plain words").parameter is None


def test_each_kind_has_its_code_and_stays_a_retriever_error():
    kinds = {RetrieverError: "bad_input", NotFoundError: "not_found", ConflictError: "conflict",
             DamagedIndexError: "damaged", UnavailableError: "unavailable"}
    for kind, code in kinds.items():
        error = kind(f"{param('k')} is wrong")
        assert isinstance(error, RetrieverError) and error.code == code
        copy = pickle.loads(pickle.dumps(error))  # as a Ray worker's error travels back
        assert type(copy) is kind and copy.render({"k": "-k"}) == "-k is wrong" and copy.parameter == "k"


def test_quoted_text_cannot_pass_for_a_parameter():
    forged = '\x00param-00000000:["api_key"]\x00'  # the mark without this process's random part
    error = NotFoundError(f"no document '{forged}' in index 'notes'")
    assert error.parameter is None and forged in str(error)


def test_a_long_word_is_shown_by_its_start_and_end():
    """A typed id or a path thousands of characters long: str(), the CLI and the server (which reads the parts)
    all get it shortened, the rest of the message whole."""
    from retriever.errors import SHOWN_WORD, shortened

    typed = "a" * 2500 + "b" * 2500
    error = NotFoundError(f"no document '{typed}' in index {param('index', 'notes')}")
    assert str(error) == f"no document '{'a' * 98}…{'b' * 99}' in index index='notes'"  # the quotes kept
    assert all(len(part) < 250 for part in error.parts if isinstance(part, str))
    assert error.parameter == "index" and shortened("short") == "short" and len(shortened(typed)) == SHOWN_WORD
    spaced = RetrieverError(f"no document '{'word ' * 1000}'")  # no long word, but a long text
    assert len(str(spaced)) == 1000 and str(spaced).startswith("no document 'word") and str(spaced).endswith("'")


def test_a_library_mistake_names_the_python_parameter(tmp_path):
    from retriever.calibration import fit_sample_rows
    from retriever.evaluation.runner import plan_benchmark
    from retriever.encode.runtimes import resolve_runtime

    with pytest.raises(RetrieverError) as caught:
        fit_sample_rows(1000, 1)
    assert str(caught.value) == "fit_sample must be at least 2 (got 1)"
    assert caught.value.parameter == "fit_sample" and caught.value.code == "bad_input"
    with pytest.raises(RetrieverError) as caught:
        plan_benchmark("stsb", data_dir=tmp_path, limit=1)
    assert str(caught.value) == "limit must be at least 2 pairs (got 1)" and caught.value.parameter == "limit"
    with pytest.raises(RetrieverError) as caught:
        plan_benchmark("stsb", ",", data_dir=tmp_path)
    assert str(caught.value) == "no calibrator given; e.g. calibrators='none,flow'"
    with pytest.raises(RetrieverError) as caught:
        resolve_runtime("onnx", "cuda")
    assert "use runtime='torch'" in str(caught.value) and "--" not in str(caught.value)


def test_the_cli_shows_its_flags_for_the_same_mistakes(cli, tmp_path):
    assert_one_line_error(cli("bench", "stsb", "--data-dir", tmp_path, "--limit", "1"),
                          "error: --limit must be at least 2 pairs (got 1)")
    assert_one_line_error(cli("bench", "stsb", "--data-dir", tmp_path, "--calibrator", ","),
                          "e.g. --calibrator none,flow")  # the library's `calibrators` is the command's --calibrator
    done = cli("serve", "--host", "0.0.0.0", "--index-dir", tmp_path)
    assert_one_line_error(done, "set one with --api-key or $RETRIEVER_API_KEY (or pass --no-key to serve")


def test_the_flag_names_come_from_the_commands():
    from cli.main import app
    from cli.options import LIBRARY_NAMES, flag_names

    commands = typer.main.get_command(app).commands
    build = flag_names(commands["build"])
    assert build["fit_sample"] == "--fit-sample" and build["name"] == "--name" and build["opq=True"] == "--opq"
    assert flag_names(commands["search"])["k"] == "-k"
    for command, names in LIBRARY_NAMES.items():  # every library name a command spells otherwise has its option
        flags = flag_names(commands[command])
        assert all(own in flags and flags[library] == flags[own] for library, own in names.items()), command


def test_the_server_body_carries_code_and_parameter(tmp_path):
    from fastapi.testclient import TestClient

    from retriever.calibration import fit_sample_rows
    from retriever.serve.app import create_app

    app = create_app(tmp_path, device="cpu")
    app.add_api_route("/fit", lambda: fit_sample_rows(1000, 1))  # a library mistake inside a request
    with TestClient(app, base_url="http://127.0.0.1") as client:
        missing = client.get("/indexes/nowhere")
        assert missing.status_code == 404
        assert missing.json()["code"] == "not_found" and missing.json()["parameter"] is None
        answer = client.get("/fit")
        assert answer.status_code == 400 and answer.json() == {
            "detail": "fit_sample must be at least 2 (got 1)", "status": 400, "code": "bad_input",
            "parameter": "fit_sample"}
