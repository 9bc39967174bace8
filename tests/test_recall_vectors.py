"""The in-process vector index: exact scan, sign-bit shortlist with exact rerank, updates and removals."""

import numpy as np

from memory.embedding.embedder import to_blob
from memory.recall.vectors import EXACT_ROWS, OwnerMatrix


def unit_rows(rng, n, dim):
    m = rng.standard_normal((n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def filled(rng, n, dim):
    vectors = unit_rows(rng, n, dim)
    matrix = OwnerMatrix(dim)
    matrix.apply(list(range(1, n + 1)), [to_blob(v) for v in vectors])
    return matrix, vectors


def test_exact_scan_returns_the_true_top_n_with_exact_cosines():
    rng = np.random.default_rng(1)
    matrix, vectors = filled(rng, 500, 32)
    query = unit_rows(rng, 1, 32)[0]
    ids, scores = matrix.top(query, 10)
    expected = np.argsort(-(vectors @ query))[:10] + 1
    assert ids.tolist() == expected.tolist()
    assert np.allclose(scores, (vectors @ query)[expected - 1], atol=1e-6)


def test_large_owner_shortlist_finds_near_neighbours_and_scores_them_exactly():
    rng = np.random.default_rng(2)
    n = EXACT_ROWS + 5_000
    matrix, vectors = filled(rng, n, 64)
    found = 0
    for row in rng.integers(0, n, size=20):
        query = vectors[row] + 0.1 * unit_rows(rng, 1, 64)[0]
        query /= np.linalg.norm(query)
        ids, scores = matrix.top(query, 10)
        found += ids[0] == row + 1
        assert np.allclose(scores, vectors[ids - 1] @ query, atol=1e-5)
        assert list(scores) == sorted(scores, reverse=True)
    assert found == 20


def test_updates_replace_and_removals_drop_a_vector():
    rng = np.random.default_rng(3)
    matrix, vectors = filled(rng, 50, 16)
    new = unit_rows(rng, 1, 16)[0]
    matrix.apply([7], [to_blob(new)])
    ids, scores = matrix.top(new, 1)
    assert ids.tolist() == [7] and abs(scores[0] - 1.0) < 1e-5
    assert matrix.size == 50
    matrix.apply([7], [None])
    assert 7 not in matrix.top(new, 50)[0].tolist()
    assert matrix.cosines([7, 8], new).keys() == {8}


def test_a_document_of_many_pieces_is_one_hit_scored_by_its_best_piece():
    rng = np.random.default_rng(4)
    matrix, vectors = filled(rng, 50, 16)
    pieces = unit_rows(rng, 5, 16)
    matrix.apply([99], [to_blob(pieces)])  # a long episode: one vector per piece, one document
    ids, scores = matrix.top(pieces[3], 10)
    assert ids[0] == 99 and abs(scores[0] - 1.0) < 1e-5
    assert len(set(ids.tolist())) == 10  # its other pieces do not take the places of other documents
    assert matrix.cosines([99], pieces[1])[99] > 0.999

    # The episode grows by one piece: its rows are reused and one is added, nothing left stale.
    grown = np.vstack([pieces, unit_rows(rng, 1, 16)])
    matrix.apply([99], [to_blob(grown)])
    assert (matrix.size, matrix.stale) == (56, 0)
    assert matrix.top(grown[5], 1)[0].tolist() == [99]
    # Rewritten shorter (a new summary): its extra rows are retired and match nothing.
    matrix.apply([99], [to_blob(grown[:1])])
    assert matrix.stale == 5
    assert 99 not in matrix.top(grown[4], 5)[0].tolist()
    assert matrix.top(grown[0], 1)[0].tolist() == [99]
