"""The pure divergence measures: exact and top-k KL, top-1, |Δ logp|, position buckets."""

import numpy as np
import pytest
import torch

from fp8eval.divergence import measures as M


def _logits(t=40, v=50, seed=0):
    return np.random.default_rng(seed).normal(size=(t, v)) * 3


def test_identical_arms_are_zero():
    a = _logits()
    assert np.allclose(M.kl_from_logits(a, a), 0)
    assert M.top1_from_logits(a, a).all()
    assert np.allclose(M.dlogp_from_logits(a, a), 0)


def test_kl_matches_definition_numpy_and_torch():
    a, b = _logits(seed=1), _logits(seed=2)
    p = np.exp(a) / np.exp(a).sum(-1, keepdims=True)
    q = np.exp(b) / np.exp(b).sum(-1, keepdims=True)
    want = (p * np.log(p / q)).sum(-1)
    assert np.allclose(M.kl_from_logits(a, b), want)
    assert np.allclose(M.kl_from_logits(torch.tensor(a), torch.tensor(b)), want)
    assert np.allclose(M.dlogp_from_logits(torch.tensor(a), torch.tensor(b)), M.dlogp_from_logits(a, b))
    assert (M.top1_from_logits(torch.tensor(a), torch.tensor(b)) == M.top1_from_logits(a, b)).all()


def _topk(logits, k):
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ids = np.argsort(-lp, axis=-1)[:, :k]
    return ids, np.take_along_axis(lp, ids, -1)


def test_topk_with_full_vocab_equals_exact_kl():
    a, b = _logits(seed=3), _logits(seed=4)
    kl, n = M.kl_from_topk(*_topk(a, 50), *_topk(b, 50))
    assert (n == 50).all()
    assert np.allclose(kl, M.kl_from_logits(a, b))
    assert np.allclose(M.dlogp_from_topk(*_topk(a, 50), *_topk(b, 50)), M.dlogp_from_logits(a, b))
    assert (M.top1_from_topk(*_topk(a, 5), *_topk(b, 5)) == M.top1_from_logits(a, b)).all()


def test_topk_shared_set_and_missing():
    base_ids = np.array([[1, 2, 3], [1, 2, 3]])
    base_lp = np.log(np.array([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]))
    var_ids = np.array([[2, 1, 9], [7, 8, 9]])
    var_lp = np.log(np.array([[0.4, 0.4, 0.2], [0.5, 0.3, 0.2]]))
    kl, n = M.kl_from_topk(base_ids, base_lp, var_ids, var_lp)
    assert list(n) == [2, 0]
    p = np.array([0.5, 0.3]) / 0.8
    q = np.array([0.4, 0.4]) / 0.8
    assert kl[0] == pytest.approx((p * np.log(p / q)).sum())
    assert np.isnan(kl[1])
    d = M.dlogp_from_topk(base_ids, base_lp, var_ids, var_lp)
    assert d[0] == pytest.approx(abs(np.log(0.4) - np.log(0.5))) and np.isnan(d[1])


def test_buckets_and_accumulator():
    assert M.bucket_labels((0, 256, 1024, 2048))[:3] == ["0-256", "256-1k", "1k-2k"]
    assert M.bucket_labels((0, 256, 1024, 2048))[-1] == "2k+"
    assert list(M.bucket_index([0, 255, 256, 5000], (0, 256, 1024))) == [0, 0, 1, 2]
    acc = M.BucketAccumulator(edges=(0, 2, 4))
    acc.add([0, 1, 2, 3, 4], kl=[1, 3, 0, 0, np.nan], top1=[1, 0, 1, 1, 1], dlogp=[0.5, 0.5, 0, 0, 1])
    r = acc.result()
    assert list(r) == ["0-2", "2-4", "4+"]
    assert r["0-2"] == {"kl_mean": 2.0, "top1_agree": 0.5, "dlogp_mean": 0.5, "n_tokens": 2}
    assert r["4+"]["kl_mean"] is None and r["4+"]["n_missing"] == {"kl": 1, "dlogp": 0}
    o = acc.overall()
    assert o["n_tokens"] == 5 and o["kl_mean"] == pytest.approx(1.0) and o["top1_agree"] == pytest.approx(0.8)
