"""The roots' prior (issue #40, item 2): a query naming a site's product lifts
the nodes under that site's root, by `root_weight` x the root's share of the
best root's BM25 over the roots' titles and site keys."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ritrag.analyzer import analyze
from ritrag.serving.api import RitragIndex
from ritrag.serving.retrieval import RetrievalParams
from ritrag.serving.root_prior import RootPrior


def test_the_named_root_gets_the_whole_prior_and_the_others_their_share():
    docs = ["PostgreSQL 15 Documentation http://localhost/postgresql", "Welcome https://www.sphinx-doc.org/en/master",
            "Welcome to Flask http://localhost/flask"]
    root_of = np.array([0, 0, 1, 2, 2, -1])
    prior = RootPrior(root_of, docs, 1.2, 0.75)
    np.testing.assert_allclose(prior.root_scores(analyze("vacuum in postgresql")), [1.0, 0.0, 0.0])
    assert prior.root_scores(analyze("vacuum")).tolist() == [0.0, 0.0, 0.0]
    # "welcome" is in two roots' documents: both match, the shorter one (Flask's) more
    both = prior.root_scores(analyze("welcome"))
    assert both[0] == 0 and both[2] == 1.0 and 0 < both[1] < 1
    boosted = prior.boost({0: 0.5, 2: 0.9, 3: 0.8, 5: 0.7}, prior.root_scores(analyze("flask signals")), 0.25)
    assert boosted == pytest.approx({0: 0.5, 2: 0.9, 3: 1.05, 5: 0.7})  # row 5: no live root
    assert prior.boost({1: 0.4}, prior.root_scores(analyze("nothing named")), 0.25) == {1: 0.4}


def test_the_dense_prior_is_the_query_vectors_similarity_min_max_over_the_roots():
    roots = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], np.float32)
    np.testing.assert_allclose(RootPrior.dense_scores(np.array([1.0, 0.0]), roots), [1.0, 0.0, 0.6], rtol=1e-6)
    assert RootPrior.dense_scores(np.array([1.0, 1.0]), roots[:2]).tolist() == [0.0, 0.0]  # a tie lifts none


def test_root_weight_adds_the_named_roots_prior_to_every_candidate_under_it(tiny_hash_index):
    index = RitragIndex(str(tiny_hash_index))
    skeleton = index.loaded.skeleton
    roots = np.flatnonzero(skeleton.parent_row < 0)
    root_title = skeleton.columns["title"][int(roots[0])].as_py()
    query = f"{root_title} install"
    base = index.retrieve(query, n=50)
    lifted = index.retrieve(query, n=50, params=dataclasses.replace(index.params, root_weight=0.5))
    prior = index.loaded.root_prior()
    shares = prior.root_scores(analyze(query))
    assert shares.max() == 1.0
    for row, score in base.scores.items():
        root = prior.root_of[row]
        assert lifted.scores[row] == pytest.approx(score + 0.5 * (shares[root] if root >= 0 else 0.0))
    dense = index.retrieve(query, n=50, params=dataclasses.replace(index.params, root_dense_weight=0.5))
    nearest = RootPrior.dense_scores(index.embed_query(query), index.root_vectors())
    assert len(index.root_vectors()) == len(prior.root_texts)
    for row, score in base.scores.items():
        root = prior.root_of[row]
        assert dense.scores[row] == pytest.approx(score + 0.5 * (nearest[root] if root >= 0 else 0.0))
    assert RitragIndex(str(tiny_hash_index)).loaded._root_prior is None  # made only when asked for


def test_a_negative_root_weight_is_refused():
    with pytest.raises(ValueError, match="non-negative"):
        RetrievalParams(root_weight=-0.1)
