import torch

from eagle_assets.draft.data import SyntheticDataset, collate
from eagle_assets.draft.model import DraftKVCache, Eagle3Draft
from eagle_assets.draft.ttt import (
    HeadFn,
    TTTOutput,
    needed_target_positions,
    shift_left,
    simulated_acceptance,
    step_attention_mask,
    target_distribution,
    ttt_forward,
)
from eagle_assets.draft.vocab import vocab_from_samples
from tests.draft.helpers import small_config


def ttt_loss(
    model: Eagle3Draft,
    batch: dict[str, torch.Tensor],
    target_head: HeadFn,
    *,
    steps: int = 7,
    step_weight: float = 0.8,
    denominators: torch.Tensor | None = None,
    attn_impl: str = "eager",
) -> TTTOutput:
    """``ttt_forward`` on a collated batch {input_ids, loss_mask, aux, last}, target logits from ``target_head``."""
    target_p, target_top = target_distribution(
        batch["last"], target_head, model.used_ids(), needed=needed_target_positions(batch["loss_mask"])
    )
    result = ttt_forward(
        model,
        batch["aux"],
        batch["input_ids"],
        batch["loss_mask"],
        target_p,
        target_top,
        steps=steps,
        step_weight=step_weight,
        denominators=denominators,
        attn_impl=attn_impl,
    )
    assert isinstance(result, TTTOutput)
    return result


def _setup(seed: int = 0, n: int = 4):
    data = SyntheticDataset(n, hidden_size=32, vocab_size=128, length=(7, 10), seed=seed)
    torch.manual_seed(seed)
    model = Eagle3Draft(small_config(), data.embed_weight)
    model.set_vocab(vocab_from_samples(data, 128, 64))
    return model, data, collate([data[i] for i in range(n)])


def ttt_attention_mask(seq_len: int, steps: int) -> torch.Tensor:
    """Bool [K*T, K*T] over all steps' queries × keys, step-major; later steps' keys are never visible."""
    full = torch.zeros(steps * seq_len, steps * seq_len, dtype=torch.bool)
    for k in range(steps):
        full[k * seq_len : (k + 1) * seq_len, : (k + 1) * seq_len] = step_attention_mask(seq_len, k)
    return full


def test_attention_mask_structure_k3():
    m = ttt_attention_mask(4, 3).int()
    # rows: queries of step 0 (t=0..3), step 1, step 2; columns: keys of step 0, 1, 2
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0],
            [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0],
            [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0],
            [1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1],
        ]
    )
    assert torch.equal(m, expected)
    assert torch.equal(step_attention_mask(4, 2).int(), expected[8:, :12])


def test_eager_equals_explicit_mask_sdpa_forward_and_backward():
    model, data, batch = _setup()
    p, top = target_distribution(batch["last"], data.target_head(), model.used_ids())
    grads = {}
    outs = {}
    for impl in ("eager", "sdpa"):
        model.zero_grad()
        out, logits = ttt_forward(
            model,
            batch["aux"],
            batch["input_ids"],
            batch["loss_mask"],
            p,
            top,
            steps=3,
            attn_impl=impl,
            return_logits=True,
        )
        out.loss.backward()
        outs[impl] = torch.stack(logits)
        grads[impl] = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    torch.testing.assert_close(outs["eager"], outs["sdpa"], rtol=1e-5, atol=1e-5)
    for name, g in grads["eager"].items():
        torch.testing.assert_close(g, grads["sdpa"][name], rtol=1e-4, atol=1e-6)


def test_ttt_step_k_equals_inference_chain_drafting():
    """TTT step k at index t == drafting k tokens after position t with a cache of target-feature entries."""
    model, data, batch = _setup()
    model.eval()
    p, top = target_distribution(batch["last"], data.target_head(), model.used_ids())
    _, logits = ttt_forward(
        model, batch["aux"], batch["input_ids"], batch["loss_mask"], p, top, steps=3, return_logits=True
    )
    ids, aux = batch["input_ids"][:1], batch["aux"][:1]
    t = 3
    with torch.no_grad():
        cache = DraftKVCache()
        h, lg = model.step(model.project(aux[:, : t + 1]), ids[:, 1 : t + 2], torch.arange(t + 1), cache.attend)
        h = h[:, -1:]
        torch.testing.assert_close(lg[0, -1], logits[0][0, t], rtol=1e-5, atol=1e-5)
        for k in (1, 2):
            # the k-th chained step feeds the ground-truth token x_{t+1+k} at position t+k
            h, lg = model.step(h, ids[:, t + 1 + k : t + 2 + k], torch.tensor([t + k]), cache.attend)
            torch.testing.assert_close(lg[0, -1], logits[k][0, t], rtol=1e-5, atol=1e-5)


def test_no_leak_from_future_positions():
    model, data, batch = _setup()
    p, top = target_distribution(batch["last"], data.target_head(), model.used_ids())
    kw = dict(steps=3, return_logits=True)
    _, a = ttt_forward(model, batch["aux"], batch["input_ids"], batch["loss_mask"], p, top, **kw)
    aux2 = batch["aux"].clone()
    aux2[:, 5:] += 3.0
    _, b = ttt_forward(model, aux2, batch["input_ids"], batch["loss_mask"], p, top, **kw)
    for k in range(3):
        assert torch.equal(a[k][:, :5], b[k][:, :5])
        assert not torch.allclose(a[k][:, 5:], b[k][:, 5:])


def test_alignment_and_loss_by_hand():
    """Step k at index t: token x_{t+1+k}, target logits z_{t+1+k}, mask loss_mask[t+2+k] × t2d[argmax z]."""
    model, data, batch = _setup(n=2)
    head = data.target_head()
    p, top = target_distribution(batch["last"], head, model.used_ids())
    out, logits = ttt_forward(
        model, batch["aux"], batch["input_ids"], batch["loss_mask"], p, top, steps=3, return_logits=True
    )
    z = head(batch["last"]).detach()
    logits = [lg.detach() for lg in logits]
    lm = batch["loss_mask"]
    used = model.used_ids()
    b_, t_ = lm.shape
    total = 0.0
    for k in range(3):
        s, correct, count = 0.0, 0, 0
        for b in range(b_):
            for t in range(t_):
                if t + 2 + k >= t_ or not lm[b, t + 2 + k]:
                    continue
                zt = z[b, t + 1 + k]
                count += 1
                pred = int(used[logits[k][b, t].argmax()])
                correct += int(pred == int(zt.argmax()))
                if model.t2d[zt.argmax()]:
                    q = torch.log_softmax(logits[k][b, t], -1)
                    s += float(-(torch.softmax(zt[used], -1) * q).sum())
        assert abs(float(out.loss_sum[k]) - s) < 1e-3
        assert int(out.correct[k]) == correct and int(out.count[k]) == count
        total += 0.8**k * s / max(count, 1)
    assert abs(float(out.loss.detach()) - total) < 1e-3


def test_shapes_counts_and_chunked_targets():
    model, data, batch = _setup()
    out = ttt_loss(model, batch, data.target_head(), steps=7)
    assert out.loss.ndim == 0 and out.loss_sum.shape == out.correct.shape == out.count.shape == (7,)
    assert bool((out.count[1:] <= out.count[:-1]).all())
    assert int(out.count[0]) == int(shift_left(batch["loss_mask"], 2, False).sum())
    p1, t1 = target_distribution(batch["last"], data.target_head(), model.used_ids(), chunk_tokens=5)
    p2, t2 = target_distribution(batch["last"], data.target_head(), model.used_ids(), chunk_tokens=10_000)
    torch.testing.assert_close(p1, p2, rtol=0, atol=1e-7)
    assert torch.equal(t1, t2) and p1.shape == (*batch["input_ids"].shape, 64)


def test_simulated_acceptance():
    assert simulated_acceptance([1.0, 1.0, 1.0]) == 3.0
    assert abs(simulated_acceptance([0.5, 0.5, 0.0, 1.0]) - 0.75) < 1e-12


def test_target_head_on_needed_positions_only_changes_nothing_the_loss_reads():
    """The head runs only where a TTT step reads the target; loss, accuracy and gradients are unchanged."""
    data = SyntheticDataset(6, hidden_size=32, vocab_size=128, length=(5, 14), seed=3)
    batch = collate([data[i] for i in range(6)])
    torch.manual_seed(0)
    model = Eagle3Draft(small_config(), data.embed_weight)
    model.set_vocab(vocab_from_samples(data, 128, 64))
    results = []
    for needed in (None, needed_target_positions(batch["loss_mask"])):
        p, top = target_distribution(batch["last"], data.target_head(), model.used_ids(), needed=needed)
        model.zero_grad()
        out = ttt_forward(model, batch["aux"], batch["input_ids"], batch["loss_mask"], p, top, steps=4)
        out.loss.backward()
        results.append((out, [q.grad.clone() for q in model.parameters() if q.grad is not None]))
    (a, ga), (b, gb) = results
    torch.testing.assert_close(a.loss, b.loss)
    assert torch.equal(a.correct, b.correct) and torch.equal(a.count, b.count)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y)
    assert needed_target_positions(batch["loss_mask"]).sum() < batch["loss_mask"].numel()
