"""GPT-NeoX model: shapes, causality, rotary, residual variants, checkpointing, init."""

from __future__ import annotations

import math

import pytest
import torch

from zerotopo.models.neox import GPTNeoX, NeoXConfig, NeoXLayer, init_std


def tiny(**kw) -> NeoXConfig:
    base = dict(
        vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16
    )
    base.update(kw)
    return NeoXConfig(**base)


def model(seed: int = 0, **kw) -> GPTNeoX:
    torch.manual_seed(seed)
    return GPTNeoX(tiny(**kw))


def reference_attention(attn, x_BSH: torch.Tensor, cfg: NeoXConfig) -> torch.Tensor:
    """Attention written out head by head, position by position, from the fused weights."""
    B, S, H = x_BSH.shape
    N, D, R = cfg.num_attention_heads, cfg.head_dim, cfg.rotary_ndims
    W, b = attn.query_key_value.weight, attn.query_key_value.bias  # [3H, H]: rows grouped per head
    out = torch.zeros(B, S, N, D, dtype=torch.float64)
    x = x_BSH.double()
    for n in range(N):
        rows = slice(n * 3 * D, (n + 1) * 3 * D)
        qkv = x @ W[rows].double().T + b[rows].double()  # [B, S, 3D]
        q, k, v = qkv[..., :D].clone(), qkv[..., D : 2 * D].clone(), qkv[..., 2 * D :]
        for t in range(S):
            for i in range(R // 2):  # channel i pairs with channel i + R/2 (non-interleaved)
                theta = t * cfg.rotary_emb_base ** (-2.0 * i / R)
                c, s = math.cos(theta), math.sin(theta)
                for z in (q, k):
                    a, bb = z[:, t, i].clone(), z[:, t, i + R // 2].clone()
                    z[:, t, i], z[:, t, i + R // 2] = a * c - bb * s, bb * c + a * s
        scores = q @ k.transpose(1, 2) / math.sqrt(D)  # [B, S, S]
        mask = torch.ones(S, S, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        out[:, :, n] = scores.softmax(-1) @ v
    o = out.reshape(B, S, H)
    return (o @ attn.dense.weight.double().T + attn.dense.bias.double()).float()


def reference_layer(layer: NeoXLayer, x: torch.Tensor, cfg: NeoXConfig) -> torch.Tensor:
    ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm

    def mlp(y):
        m = layer.mlp
        hid = y @ m.dense_h_to_4h.weight.T + m.dense_h_to_4h.bias
        act = 0.5 * hid * (1 + torch.erf(hid / math.sqrt(2)))
        if cfg.gelu_approximate:
            act = 0.5 * hid * (1 + torch.tanh(math.sqrt(2 / math.pi) * (hid + 0.044715 * hid**3)))
        return act @ m.dense_4h_to_h.weight.T + m.dense_4h_to_h.bias

    if cfg.gpt_j_residual:
        return x + reference_attention(layer.attention, ln1(x), cfg) + mlp(ln2(x))
    y = x + reference_attention(layer.attention, ln1(x), cfg)
    return y + mlp(ln2(y))


def test_shapes_and_units():
    m = model()
    ids = torch.randint(0, 64, (3, 7))
    assert m(ids).shape == (3, 7, 64)
    assert isinstance(m.embed_in, torch.nn.Embedding) and len(m.layers) == 2
    assert m.head.embed_out.bias is None
    assert m.num_parameters() == m.config.shape(7).param_count()


def test_each_unit_called_once():
    m = model()
    calls = []
    for unit in [m.embed_in, *m.layers, m.head]:
        unit.register_forward_pre_hook(lambda mod, args: calls.append(type(mod).__name__))
    m(torch.randint(0, 64, (1, 5)))
    assert calls == ["Embedding", "NeoXLayer", "NeoXLayer", "NeoXHead"]


def test_causal_masking():
    m = model()
    ids = torch.randint(0, 64, (2, 10))
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 64
    a, b = m(ids), m(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("rotary_pct", [0.25, 1.0, 0.0])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("approx", [False, True])
def test_layer_matches_reference(rotary_pct, parallel, approx):
    cfg = tiny(rotary_pct=rotary_pct, gpt_j_residual=parallel, gelu_approximate=approx, rotary_emb_base=100)
    torch.manual_seed(1)
    layer = GPTNeoX(cfg).layers[0]
    with torch.no_grad():  # non-zero biases so the reference sees their layout too
        for p in layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), reference_layer(layer, x, cfg), atol=1e-5, rtol=1e-4)


def test_residual_variants_differ():
    ids = torch.randint(0, 64, (2, 6))
    assert not torch.allclose(model(gpt_j_residual=True)(ids), model(gpt_j_residual=False)(ids))


def test_rotary_pct_changes_output():
    ids = torch.randint(0, 64, (2, 6))
    assert not torch.allclose(model(rotary_pct=1.0)(ids), model(rotary_pct=0.25)(ids))
    assert tiny(rotary_pct=0.25).rotary_ndims == 2 and tiny(rotary_pct=1.0).rotary_ndims == 8


def test_rotary_relative_position():
    """q·k after rotary depends only on the distance between the two positions."""
    attn = model(rotary_pct=1.0).layers[0].attention
    S, D = 12, 8
    q0, k0 = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    rep_q, rep_k = q0.expand(1, 1, S, D), k0.expand(1, 1, S, D)
    cos, sin = attn.rotary.cos_sin(S, torch.device("cpu"), torch.float64)
    q, k = attn.rotary(rep_q, cos, sin)[0, 0], attn.rotary(rep_k, cos, sin)[0, 0]
    dots = q @ k.T  # [S, S], entry (i, j) = q at position i · k at position j
    for delta in range(-3, 4):
        diag = torch.diagonal(dots, offset=delta)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(dots[0, 0], dots[0, 1])


def test_checkpoint_activations_same_outputs_and_grads():
    ids = torch.randint(0, 64, (2, 8))
    plain, ckpt = model(seed=3), model(seed=3, checkpoint_activations=True)
    for m in (plain, ckpt):
        m(ids).logsumexp(-1).sum().backward()
    torch.testing.assert_close(plain(ids), ckpt(ids))
    for (n, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=n)


def test_tied_embeddings_share_one_parameter():
    m = model(tie_embeddings=True)
    assert m.head.embed_out.weight is m.embed_in.weight
    assert m.num_parameters() == m.config.shape(4).param_count()


def test_deterministic_init():
    a, b = model(seed=7), model(seed=7)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("method", ["normal", "scaled_normal", "small_init", "wang_init"])
def test_init_std(method):
    cfg = NeoXConfig(
        vocab_size=128,
        hidden_size=256,
        num_layers=4,
        num_attention_heads=4,
        init_method=method,
        output_layer_init_method=method,
    )
    torch.manual_seed(0)
    m = GPTNeoX(cfg)
    want = {
        "normal": 0.02,
        "scaled_normal": 0.02 / math.sqrt(8),
        "small_init": math.sqrt(2 / (5 * 256)),
        "wang_init": 2 / (4 * math.sqrt(256)),
    }[method]
    assert init_std(method, cfg) == pytest.approx(want)
    layer = m.layers[0]
    for w in (m.embed_in.weight, layer.attention.query_key_value.weight, layer.mlp.dense_4h_to_h.weight):
        assert w.std().item() == pytest.approx(want, rel=0.05)
    assert torch.count_nonzero(layer.attention.dense.bias) == 0
    assert torch.equal(layer.input_layernorm.weight, torch.ones(256))


def test_bad_config_rejected():
    with pytest.raises(ValueError, match="multiple"):
        tiny(num_attention_heads=5)
    with pytest.raises(ValueError, match="init_method"):
        tiny(init_method="xavier")
