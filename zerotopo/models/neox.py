"""The GPT-NeoX architecture as GPT-NeoX and Pythia use it, in plain PyTorch.

A model is three kinds of modules, each called exactly once per forward through its own ``__call__``:
the input embedding ``embed_in``, the transformer layers ``layers[i]`` and the ``head`` (final LayerNorm and
output projection). The sharding engine wraps those as units; nothing here knows about sharding.

The Llama family is the same model with NeoX's switches (``norm: rmsnorm``, a gated SiLU MLP, grouped-query
attention through ``num_kv_heads``, no biases, full rotary, sequential residual). Every projection and norm
is built from the architecture's description (:meth:`~zerotopo.placement.architecture.Architecture.layer_modules`:
its shape and whether it has a bias), the same description the cost model counts and the checkpoint name
mapping reads; the fused ``query_key_value`` layout is its [Note: NeoX layout].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from zerotopo.models.config import INIT_METHODS, NeoXConfig
from zerotopo.placement.architecture import ModuleSpec


def init_std(method: str, cfg: NeoXConfig) -> float:
    """Standard deviation of NeoX's init ``method`` (megatron/model/init_functions.py)."""
    h, L = cfg.hidden_size, cfg.num_layers
    if method == "normal":
        return cfg.init_std
    if method == "scaled_normal":
        return cfg.init_std / math.sqrt(2.0 * L)
    if method == "small_init":
        return math.sqrt(2.0 / (5.0 * h))
    if method == "wang_init":
        return 2.0 / (L * math.sqrt(h))
    raise ValueError(f"unknown init method {method!r}; expected one of {', '.join(INIT_METHODS)}")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dim (GPT-NeoX's non-interleaved rotary)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def llama3_inv_freq(
    inv_freq_F: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float, original: int
) -> torch.Tensor:
    """Llama 3.1's rescaled rotary frequencies (Meta's ``apply_scaling``; ``rope_type: llama3``).

    Frequencies whose wavelength ``2π/f`` is shorter than ``original / high_freq_factor`` are kept, those
    longer than ``original / low_freq_factor`` are divided by ``factor``, and the band between is a
    linear blend of the two weighted by ``s = (original/wavelength - low) / (high - low)``."""
    wavelen_F = 2 * math.pi / inv_freq_F
    scaled_F = torch.where(wavelen_F > original / low_freq_factor, inv_freq_F / factor, inv_freq_F)
    s_F = (original / wavelen_F - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended_F = (1 - s_F) * scaled_F / factor + s_F * scaled_F
    medium = (wavelen_F >= original / high_freq_factor) & (wavelen_F <= original / low_freq_factor)
    return torch.where(medium, blended_F, scaled_F)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding on the first ``dim`` channels of each head (Su et al., 2021).

    It holds no buffer: the frequency table is a function of the config, recomputed per call (``dim / 2``
    values), so a model built on the meta device or flattened by the sharding engine has only parameters.
    ``llama3``: ``(factor, low_freq_factor, high_freq_factor, original_max_position)`` of Llama 3.1's
    rescaling (:func:`llama3_inv_freq`); None: the plain frequencies.
    """

    def __init__(self, dim: int, base: int, llama3: tuple[float, float, float, int] | None = None):
        super().__init__()
        self.dim, self.base, self.llama3 = dim, base, llama3

    def cos_sin(
        self, seq_len: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables of shape ``[S, dim]``, computed in fp32 and cast to ``dtype``."""
        inv_freq_F = 1.0 / (
            self.base ** (torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim)
        )
        if self.llama3 is not None:
            inv_freq_F = llama3_inv_freq(inv_freq_F, *self.llama3)
        t_S = torch.arange(seq_len, device=device, dtype=torch.float32)
        freqs_SF = torch.outer(t_S, inv_freq_F)  # F = dim / 2
        emb_SD = torch.cat((freqs_SF, freqs_SF), dim=-1)
        return emb_SD.cos().to(dtype), emb_SD.sin().to(dtype)

    def forward(self, x_BNSD: torch.Tensor, cos_SD: torch.Tensor, sin_SD: torch.Tensor) -> torch.Tensor:
        if self.dim == 0:
            return x_BNSD
        rot, rest = x_BNSD[..., : self.dim], x_BNSD[..., self.dim :]
        rot = rot * cos_SD + rotate_half(rot) * sin_SD
        return torch.cat((rot, rest), dim=-1)


class RMSNorm(nn.Module):
    """Root-mean-square norm, ``x·rsqrt(mean(x²) + eps)·weight (+ bias)``, computed in fp32 as Llama does."""

    def __init__(self, size: int, eps: float, bias: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return self.weight * y if self.bias is None else self.weight * y + self.bias


def make_norm(cfg: NeoXConfig, spec: ModuleSpec) -> nn.Module:
    """The configured norm (``norm``, its epsilon) of the described module ``spec`` (its size and bias)."""
    size, bias = spec.shape[0], spec.bias
    if cfg.norm == "rmsnorm":
        return RMSNorm(size, cfg.rms_norm_epsilon, bias)
    return nn.LayerNorm(size, eps=cfg.layernorm_epsilon, bias=bias)


def make_linear(spec: ModuleSpec) -> nn.Linear:
    """The described projection: weight ``[out, in]`` and its bias, if any."""
    out_features, in_features = spec.shape
    return nn.Linear(in_features, out_features, bias=spec.bias)


def activation(cfg: NeoXConfig):
    """The MLP's activation function."""
    if cfg.activation == "silu":
        return F.silu
    approximate = "tanh" if cfg.gelu_approximate else "none"
    return lambda x: F.gelu(x, approximate=approximate)


class NeoXAttention(nn.Module):
    """Causal self-attention with NeoX's fused QKV layout, partial rotary and optional grouped-query heads."""

    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.num_heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.kv_heads, cfg.head_dim
        self.query_key_value = make_linear(cfg.module_spec("attention.query_key_value"))
        self.dense = make_linear(cfg.module_spec("attention.dense"))
        llama3 = (
            (
                cfg.rope_factor,
                cfg.rope_low_freq_factor,
                cfg.rope_high_freq_factor,
                cfg.rope_original_max_position,
            )
            if cfg.rope_type == "llama3"
            else None
        )
        self.rotary = RotaryEmbedding(cfg.rotary_ndims, cfg.rotary_emb_base, llama3)
        qk = cfg.qk_norm  # OLMo-2: over the whole projections, before rotary
        self.q_norm = make_norm(cfg, cfg.module_spec("attention.q_norm")) if qk else None
        self.k_norm = make_norm(cfg, cfg.module_spec("attention.k_norm")) if qk else None
        self.sliding_window = cfg.sliding_window

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x_BSH)
        gqa = self.kv_heads != self.num_heads  # each key/value head serves num_heads / kv_heads query heads
        S, W = q.shape[2], self.sliding_window
        if W is not None and S > W:
            # query i sees keys j with i - W < j <= i (Mistral's window); [S, S], True attends
            i_S1, j_1S = torch.arange(S, device=q.device)[:, None], torch.arange(S, device=q.device)[None, :]
            mask_SS = (j_1S <= i_S1) & (j_1S > i_S1 - W)
            o_BNSD = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_SS, enable_gqa=gqa)
        else:
            o_BNSD = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        B, N, S, D = o_BNSD.shape
        return self.dense(o_BNSD.transpose(1, 2).reshape(B, S, N * D))  # [B, S, N, D] -> [B, S, H]

    def qkv(self, x_BSH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``[B, heads, S, head_dim]``, keys (both rotated) and values ``[B, kv_heads, S, head_dim]``."""
        B, S, _ = x_BSH.shape
        N, K, D = self.num_heads, self.kv_heads, self.head_dim
        qkv = self.query_key_value(x_BSH)
        if K == N:  # [B, S, N·3D] -> [B, S, N, 3D]: per head q|k|v, see [Note: NeoX layout]
            q, k, v = qkv.view(B, S, N, 3 * D).transpose(1, 2).split(D, dim=-1)  # each [B, N, S, D]
        else:  # [q_all | k_all | v_all] blocks, see [Note: NeoX layout]
            q_BSND, k_BSKD, v_BSKD = qkv.split([N * D, K * D, K * D], dim=-1)
            q = q_BSND.view(B, S, N, D).transpose(1, 2)
            k, v = (t.view(B, S, K, D).transpose(1, 2) for t in (k_BSKD, v_BSKD))
        if self.q_norm is not None:
            q, k = _whole_norm(self.q_norm, q), _whole_norm(self.k_norm, k)
        cos, sin = self.rotary.cos_sin(S, x_BSH.device, q.dtype)
        return self.rotary(q, cos, sin), self.rotary(k, cos, sin), v


def _whole_norm(norm: nn.Module, x_BNSD: torch.Tensor) -> torch.Tensor:
    """``norm`` over all heads of each token at once (OLMo-2's QK-norm), shape kept."""
    B, N, S, D = x_BNSD.shape
    y_BSX = norm(x_BNSD.transpose(1, 2).reshape(B, S, N * D))  # heads in order, as q_proj/k_proj rows
    return y_BSX.view(B, S, N, D).transpose(1, 2)


class NeoXMLP(nn.Module):
    """The feed-forward block: ``dense_4h_to_h(act(dense_h_to_4h(x)))``."""

    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.dense_h_to_4h = make_linear(cfg.module_spec("mlp.dense_h_to_4h"))
        self.dense_4h_to_h = make_linear(cfg.module_spec("mlp.dense_4h_to_h"))
        self.act = activation(cfg)

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x_BSH)))

    def linears(self) -> list[tuple[nn.Linear, bool]]:
        """Each projection and whether it is an output projection (for the init)."""
        return [(self.dense_h_to_4h, False), (self.dense_4h_to_h, True)]


class GatedMLP(nn.Module):
    """The gated (SwiGLU with SiLU) block of NeoX's ``LLaMAParallelMLP``: ``w2(act(w1(x)) * w3(x))``."""

    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.w1 = make_linear(cfg.module_spec("mlp.w1"))  # gate
        self.w3 = make_linear(cfg.module_spec("mlp.w3"))  # up
        self.w2 = make_linear(cfg.module_spec("mlp.w2"))  # down
        self.act = activation(cfg)

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act(self.w1(x_BSH)) * self.w3(x_BSH))

    def linears(self) -> list[tuple[nn.Linear, bool]]:
        """Each projection and whether it is an output projection (for the init)."""
        return [(self.w1, False), (self.w3, False), (self.w2, True)]


class NeoXLayer(nn.Module):
    """One transformer layer: two norms, attention and MLP with a parallel or sequential residual."""

    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.input_layernorm = make_norm(cfg, cfg.module_spec("input_layernorm"))
        self.post_attention_layernorm = make_norm(cfg, cfg.module_spec("post_attention_layernorm"))
        self.attention = NeoXAttention(cfg)
        self.mlp = GatedMLP(cfg) if cfg.gated_mlp else NeoXMLP(cfg)
        self.gpt_j_residual = cfg.gpt_j_residual
        self.post_norm = cfg.post_norm
        self.checkpoint_activations = cfg.checkpoint_activations

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        # Checkpointing inside the layer keeps ``layer(x)`` a single ``__call__`` for the engine's hooks.
        if self.checkpoint_activations and torch.is_grad_enabled():
            return checkpoint(self._body, x_BSH, use_reentrant=False)
        return self._body(x_BSH)

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_norm:  # OLMo-2: x + norm(attn(x)), then x + norm(mlp(x))
            a = self.input_layernorm(self.attention(x))
            if self.gpt_j_residual:
                return x + a + self.post_attention_layernorm(self.mlp(x))
            x = x + a
            return x + self.post_attention_layernorm(self.mlp(x))
        if self.gpt_j_residual:
            return x + self.attention(self.input_layernorm(x)) + self.mlp(self.post_attention_layernorm(x))
        x = x + self.attention(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class NeoXHead(nn.Module):
    """Final norm and the output projection to vocabulary logits.

    With tied embeddings ``embed_out.weight`` *is* ``embed_in.weight`` (the same Parameter object, set by
    :class:`GPTNeoX`), so the parameter appears in two units: the sharding engine keeps it in the
    embedding's unit and gathers that unit for the head too.
    """

    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.final_layer_norm = make_norm(cfg, cfg.module_spec("final_layer_norm"))
        # tied: the description has no projection of its own; GPTNeoX shares the embedding's after build
        self.embed_out = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        return self.embed_out(self.final_layer_norm(x_BSH))


class GPTNeoX(nn.Module):
    """A GPT-NeoX causal language model: ``embed_in`` → ``layers`` → ``head``.

    [Note: NeoX init order] The modules are built without storage and then initialized by
    :meth:`reset_parameters`, which draws from the default generator once per weight matrix in unit order
    (``embed_in``, ``layers[0..L-1]``, ``head``) and nothing else. Built inside
    ``with torch.device("meta"):`` the model stays storage-less; the sharding engine then calls
    :meth:`init_unit` on each unit in the same order, so every rank reproduces the eager values of the same
    seed while holding one unit at a time.
    """

    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.config = cfg
        device = torch.get_default_device()
        # torch layers draw their own default init when built; building on meta skips those draws, so
        # the generator is consumed by NeoX's init alone (the same draws an engine replays per unit)
        with torch.device("meta"):
            (embedding,) = cfg.embedding_modules()
            self.embed_in = nn.Embedding(*embedding.shape)  # [vocab, hidden]
            self.layers = nn.ModuleList(NeoXLayer(cfg) for _ in range(cfg.num_layers))
            self.head = NeoXHead(cfg)
        if device.type != "meta":
            self.to_empty(device=device)
        if cfg.tie_embeddings:  # after to_empty, which would give each module its own copy
            self.head.embed_out.weight = self.embed_in.weight
        if device.type != "meta":
            self.reset_parameters()

    def forward(self, input_ids_BS: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, S, vocab]`` for token ids ``[B, S]``."""
        x_BSH = self.embed_in(input_ids_BS)
        for layer in self.layers:
            x_BSH = layer(x_BSH)
        return self.head(x_BSH)

    def unit_modules(self) -> list[nn.Module]:
        """The modules :meth:`init_unit` initializes, in init order."""
        return [self.embed_in, *self.layers, self.head]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """NeoX init: weights normal with the configured std, biases zero, norms ones/zeros."""
        for module in self.unit_modules():
            self.init_unit(module)

    @torch.no_grad()
    def init_unit(self, module: nn.Module) -> None:
        """Initialize one of :meth:`unit_modules` in place (see [Note: NeoX init order])."""
        cfg = self.config
        std_in, std_out = init_std(cfg.init_method, cfg), init_std(cfg.output_layer_init_method, cfg)
        if module is self.embed_in:
            nn.init.normal_(module.weight, std=std_in)
        elif isinstance(module, NeoXLayer):
            attention = [(module.attention.query_key_value, False), (module.attention.dense, True)]
            for linear, is_output in attention + module.mlp.linears():
                nn.init.normal_(linear.weight, std=std_out if is_output else std_in)
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)
        elif module is self.head:
            if not cfg.tie_embeddings:  # tied: the embedding's init is the projection's (no draw here)
                nn.init.normal_(module.embed_out.weight, std=std_in)
        else:
            raise ValueError(
                f"{type(module).__name__} is not a unit of this model (embed_in, a layer or head)"
            )
        for m in module.modules():
            if isinstance(m, (nn.LayerNorm, RMSNorm)):
                nn.init.ones_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def num_parameters(self) -> int:
        """Distinct parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())
