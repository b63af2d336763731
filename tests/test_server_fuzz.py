"""A bounded fuzz of the HTTP API (hypothesis): random paths, parameters, headers and JSON bodies, lone surrogates
and undecodable bytes included, against a real index. Whatever arrives, the answer is JSON with a status below
500 (an error says what was wrong in `detail`), and the server goes on answering."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retriever.serve.app import create_app
from tests.helpers import build_notes, documents


EXAMPLES = 300  # bounded and derandomized: the same cases on every run, a few seconds on two cores

# Every code point, with the troublesome ones drawn often: lone surrogates (rare among 1.1 million code points),
# controls, NUL, and plain letters so that some texts are ordinary.
# (Joined from single characters: st.text() leaves surrogates out whatever its alphabet allows.)
any_text = st.lists(st.one_of(st.characters(exclude_categories=()), st.characters(categories=["Cs"]),
                              st.sampled_from(list("ab 7\x00\x1b\n\t\u202e"))), max_size=40).map("".join)
url_part = st.one_of(
    st.sampled_from(["notes", "d1", "d2", "", ".", "..", "-", "none"]),
    st.binary(max_size=12).map(lambda raw: quote(raw, safe="")),  # undecodable bytes, percent-encoded
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12).map(lambda text: quote(text, safe="")),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**30) | st.floats(allow_nan=False) | any_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4),
    max_leaves=12,
)
query_items = st.one_of(any_text, st.fixed_dictionaries({"text": any_text}, optional={"id": json_values}),
                        json_values)
well_formed_search = st.fixed_dictionaries(  # passes validation, so the text itself is what is tested
    {"queries": st.lists(st.one_of(any_text, st.fixed_dictionaries({"text": any_text, "id": any_text})),
                         min_size=1, max_size=4)},
    optional={"k": st.integers(1, 50), "space": st.sampled_from(["raw", "calibrated"])})
any_search = st.fixed_dictionaries({}, optional={
    "queries": st.one_of(st.lists(query_items, max_size=5), json_values),
    "k": st.one_of(st.integers(-5, 2000), json_values), "index": st.one_of(st.just("notes"), json_values),
    "space": st.one_of(st.sampled_from(["raw", "calibrated"]), json_values),
    "nprobe": json_values, "ef_search": json_values, "rerank": json_values,
})
records = st.one_of(st.fixed_dictionaries({"_id": st.one_of(any_text, json_values), "text": st.one_of(any_text, json_values)},
                                          optional={"title": json_values, "id": json_values}), json_values)
well_formed_add = st.fixed_dictionaries({"documents": st.lists(st.fixed_dictionaries(
    {"_id": any_text, "text": any_text}, optional={"title": any_text}), min_size=1, max_size=3)})
add_bodies = st.one_of(well_formed_add, st.fixed_dictionaries({"documents": st.lists(records, max_size=3)}),
                       json_values)
search_bodies = st.one_of(well_formed_search, any_search)
parameters = st.dictionaries(st.sampled_from(["q", "k", "index", "space", "nprobe", "ef_search", "rerank", "x"]),
                             st.one_of(any_text, st.integers(-5, 5000).map(str)), max_size=4)


def _query_string(params: dict) -> str:
    """PARAMS percent-encoded from their UTF-8 bytes, surrogates kept, as a hostile client can send them."""
    return "&".join(f"{key}={quote(value.encode('utf-8', 'surrogatepass'), safe='')}" for key, value in params.items())


def _header_bytes(text: str) -> bytes:
    """TEXT as raw header bytes (UTF-8, surrogates kept), without the line breaks that would end the header."""
    return text.encode("utf-8", "surrogatepass").replace(b"\r", b" ").replace(b"\n", b" ")[:200]


requests = st.one_of(
    st.tuples(st.just("GET"), st.just("/search"), parameters, st.none()),
    st.tuples(st.just("POST"), st.just("/search"), st.just({}), search_bodies),
    st.tuples(st.just("GET"), url_part.map(lambda name: f"/indexes/{name}"), st.just({}), st.none()),
    st.tuples(st.sampled_from(["GET", "DELETE"]), st.tuples(url_part, url_part).map(
        lambda parts: f"/indexes/{parts[0]}/documents/{parts[1]}"), st.just({}), st.none()),
    st.tuples(st.just("POST"), url_part.map(lambda name: f"/indexes/{name}/documents"), st.just({}), add_bodies),
    st.tuples(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]), url_part.map(lambda part: f"/{part}"),
              parameters, st.one_of(st.none(), json_values)),
)


@pytest.fixture(scope="module")
def fuzzed_client(tmp_path_factory, tiny_bert):
    folder = tmp_path_factory.mktemp("fuzz") / "indexes"
    build_notes(folder, tiny_bert, 40)
    with TestClient(create_app(folder, device="cpu"), base_url="http://127.0.0.1",
                    raise_server_exceptions=False) as client:
        yield client


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(request=requests, header=st.one_of(st.none(), any_text))
def test_no_request_gets_a_5xx_or_a_traceback(fuzzed_client, request, header):
    method, path, params, body = request
    headers = {"content-type": "application/json"}
    if header is not None:
        headers["x-fuzz"] = _header_bytes(header)
    content = None if body is None else json.dumps(body).encode()  # ASCII: surrogates go as \\udXXX escapes
    url = f"{path}?{_query_string(params)}" if params else path
    response = fuzzed_client.request(method, url, content=content, headers=headers)
    assert response.status_code < 500, (method, path, params, body, response.text)
    if response.status_code == 200 and response.headers["content-type"].startswith("text/html"):
        return  # the search page (a client normalizes /indexes/.. to /)
    answer = response.json()
    if response.status_code >= 400:
        assert isinstance(answer["detail"], str) and "Traceback" not in answer["detail"], answer
    assert "Traceback" not in response.text


def test_the_server_still_answers_after_the_fuzz(fuzzed_client):
    assert fuzzed_client.get("/search", params={"q": documents(40)[3]["text"], "k": 1}).json()[
        "queries"][0]["results"][0]["doc_id"] in {"d3"} | {f"d{n}" for n in range(40)}
