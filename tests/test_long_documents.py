"""The long-document sets (issue 42's yardstick): a sentence from the last quarter of a long page, or its rarest
words, and the page among short paragraphs of the same source."""

from __future__ import annotations

import pytest

from retriever.evaluation.long_documents import LONG_DOCUMENT_TASKS, LONG_WORDS, RARE_WORDS


@pytest.fixture(scope="module")
def sets(shared_data):
    task = LONG_DOCUMENT_TASKS["long-python-doc"]
    return task.load(shared_data), task.load(shared_data, rare=True)


def test_each_query_is_a_sentence_of_its_page_s_last_quarter(sets):
    sentences, _ = sets
    assert len(sentences.queries) == 200 and len(sentences.corpus) == 4200
    for query, relevant in sentences.qrels.items():
        [page] = relevant
        title, text = sentences.corpus[page]
        flat = " ".join(text.split())
        assert len(flat.split()) >= LONG_WORDS and flat.rfind(sentences.queries[query]) >= 0.7 * len(flat)
    short = [text for doc, (_, text) in sentences.corpus.items() if ":p" in doc and ":page" not in doc]
    assert len(short) == 4000 and max(len(text.split()) for text in short) < LONG_WORDS


def test_the_rare_form_asks_for_the_same_pages_with_a_few_words_of_the_same_sentence(sets, shared_data):
    sentences, rare = sets
    assert rare.qrels == sentences.qrels and rare.corpus == sentences.corpus
    for query in sentences.queries:
        words = rare.queries[query].split()
        assert len(words) == RARE_WORDS and all(word in sentences.queries[query] for word in words)
    assert LONG_DOCUMENT_TASKS["long-python-doc"].load(shared_data, rare=True).queries == rare.queries  # seeded
