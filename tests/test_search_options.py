"""SearchOptions: the one declaration of the search parameters, checked when made, and the key a server's batch
shares a search by."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from retriever.errors import RetrieverError
from retriever.filters import FilterError
from retriever.search.fusion import Fusion
from retriever.search.options import FUSIONS, MAX_K, SearchOptions, described


def test_the_declared_fusions_are_the_registry():
    assert tuple(sorted(Fusion.registry)) == FUSIONS


@pytest.mark.parametrize("settings, message", [
    ({"k": 0}, "k must be at least 1"),
    ({"k": MAX_K + 1}, "k is at most 10,000"),
    ({"k": True}, "k must be a whole number"),
    ({"k": 2.5}, "k must be a whole number"),
    ({"mode": "fuzzy"}, "unknown mode 'fuzzy'; known: dense, keyword, hybrid"),
    ({"fusion": "max"}, "unknown fusion 'max'; known: null, rrf, zscore"),
    ({"weight": -0.1}, "weight is the dense side's share, from 0 to 1"),
    ({"weight": "0.5"}, "weight must be a number"),
    ({"min_score": 1.5}, "min_score is a cosine: between -1 and 1"),
    ({"min_score": 0.2, "mode": "keyword"}, "keyword search has none"),
    # hybrid search's settings with one side: refused, not ignored (from a CLI QA run)
    ({"weight": 0.3, "mode": "dense"}, "^weight says how hybrid search fuses its two sides; mode='dense' searches"),
    ({"fusion": "rrf", "mode": "keyword"}, "^fusion says how hybrid search fuses its two sides; mode='keyword'"),
    ({"space": "warped"}, "unknown space 'warped'"),
    ({"space": "raw", "mode": "hybrid"}, "space='raw' ranks by the uncalibrated vectors"),
    ({"nprobe": 0}, "nprobe must be at least 1"),
    ({"ef_search": -3}, "ef_search must be at least 1"),
    ({"rerank": 0}, "rerank must be at least 1"),
    ({"nprobe": 10**20}, "nprobe is at most 1,000,000"),  # past FAISS's integers: a traceback
    ({"k": 10**5000}, r"k is at most 10,000$"),
    ({"k": -10**5000}, r"k must be at least 1$"),
    ({"ef_search": 10**5000}, "ef_search is at most 1,000,000"),  # too long to print, so not shown
    ({"rerank": 10**8}, "rerank is at most 1,000"),  # k x rerank candidates: 37 GiB
])
def test_a_bad_value_is_one_line_naming_the_parameter(settings, message):
    with pytest.raises(RetrieverError, match=message) as raised:
        SearchOptions(**settings)
    assert "\n" not in str(raised.value) and raised.value.parameter in settings


def test_a_filter_is_compiled_when_the_options_are_made():
    options = SearchOptions(where='{"lang": "en"}')
    assert options.where.source == {"lang": "en"} and "FROM fields" in options.where.sql
    with pytest.raises(FilterError, match="where: not valid JSON"):
        SearchOptions(where="{lang")


def test_options_are_values_whatever_their_filter_was_written_as():
    """A server batches requests by their options: the same filter, written as text or as an object, keys alike."""
    as_text = SearchOptions(k=5, where='{"year": {"$gte": 2020}, "lang": "en"}')
    as_object = SearchOptions(k=np.int64(5), where={"lang": "en", "year": {"$gte": 2020}})
    assert as_text == as_object and hash(as_text) == hash(as_object) and type(as_object.k) is int
    assert as_text != SearchOptions(k=5, where={"lang": "fr"})


def test_requests_share_a_search_by_everything_but_a_dense_min_score():
    """A dense search's min_score is applied to each request's own answer; a hybrid search's decides which of its
    candidates are fused into the top k, so it keys the batch. k decides what the search reads (an hnsw beam of at
    least k, k x rerank compressed candidates, a filter's plan, hybrid lists of at least k): it stays in the key."""
    floors = [SearchOptions(k=5, mode="dense", min_score=floor) for floor in (None, 0.3, -0.5)]
    assert len({options.batch_key() for options in floors}) == 1
    hybrid = [SearchOptions(k=5, mode="hybrid", min_score=floor) for floor in (None, 0.3, -0.5)]
    assert len({options.batch_key() for options in hybrid}) == 3
    assert SearchOptions(k=5, mode="dense").batch_key() != SearchOptions(k=50, mode="dense").batch_key()
    assert [SearchOptions(k=k, mode="hybrid").depth for k in (5, 100, 500)] == [100, 100, 500]
    assert SearchOptions(k=5, mode="hybrid", weight=0.5).batch_key() != SearchOptions(k=5, mode="hybrid").batch_key()
    with pytest.raises(RetrieverError, match="k must be given"):
        SearchOptions(k=None)
    with pytest.raises(RetrieverError, match="space must be given"):
        SearchOptions(space=None)


def test_hybrid_settings_left_by_an_index_that_searches_one_side_are_dropped_not_refused():
    """From the review: an unset mode resolved to dense (no keyword index, or the raw space) was refused as if the
    user had asked for dense search with a weight."""
    assert SearchOptions(weight=0.3).resolved("i", has_keywords=False).mode == "dense"
    assert SearchOptions(weight=0.3, fusion="rrf", space="raw").resolved("i", has_keywords=True).weight is None


def test_of_takes_the_fields_as_keywords_over_given_options():
    base = SearchOptions(k=3, mode="dense")
    assert SearchOptions.of(base, k=7) == SearchOptions(k=7, mode="dense")
    assert SearchOptions.of(None, mode="keyword").mode == "keyword"
    with pytest.raises(RetrieverError, match="unknown search parameter kk"):
        SearchOptions.of(None, kk=3)


def test_the_mode_is_resolved_by_the_index():
    assert SearchOptions().resolved("notes", has_keywords=True).mode == "hybrid"
    assert SearchOptions().resolved("notes", has_keywords=False).mode == "dense"
    assert SearchOptions(space="raw").resolved("notes", has_keywords=True).mode == "dense"
    with pytest.raises(RetrieverError, match="index 'notes' has no keyword index .* compacting it adds one"):
        SearchOptions(mode="hybrid").resolved("notes", has_keywords=False)
    assert SearchOptions(min_score=0.1).resolved("notes", has_keywords=True).min_score == 0.1  # hybrid: its dense side


def test_every_parameter_says_what_it_means_and_what_none_means():
    for spec in fields(SearchOptions):
        about = described(spec.name)
        assert about["help"] and about["kind"] in (int, float, str, bool, "filter")
        assert spec.default is not None or about["unset"], spec.name


def test_the_http_requests_and_the_cli_flags_are_made_from_the_options():
    """One declaration: every search parameter is a field of the API's requests and a flag of `retriever search`,
    with the same meaning and bounds (the API bounds k further, under a name of its own)."""
    from typer.main import get_command

    from cli.main import app
    from retriever.serve.protocol import HTTP_MAX_K, SearchQuery, SearchRequest

    names = [spec.name for spec in fields(SearchOptions)]
    for model in (SearchRequest, SearchQuery):
        assert set(names) <= set(model.model_fields)
        assert model.model_json_schema()["properties"]["k"]["maximum"] == HTTP_MAX_K < MAX_K
        assert {"ge": 0.0, "le": 1.0} == {key: getattr(bound, key) for bound in model.model_fields["weight"].metadata
                                         for key in ("ge", "le") if hasattr(bound, key)}
        assert all(model.model_fields[name].description.startswith(described(name)["help"]) for name in names)
    search = next(command for command in get_command(app).commands.values() if command.name == "search")
    flags = {option.name: option for option in search.params}
    assert set(names) - {"stop_words"} <= set(flags)  # stop_words: a library and API setting
    shell_words = {name: flags[name].help.replace("'{", "{").replace("}'", "}") for name in flags}  # --where quoted
    assert all(described(name)["help"] in shell_words[name] for name in names if name in flags)
    assert flags["mode"].metavar == "[dense|keyword|hybrid]" and flags["k"].max == MAX_K
