"""Shared pieces of the engine tests: a tiny model, deterministic data, a single-process AdamW
reference, and the per-rank training worker that runs many plans inside one spawn."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, HIDDEN, BATCH, SEQ = 37, 12, 2, 6
STEPS, MICRO = 5, 2
WORLD = 8


class Block(nn.Module):
    """A pre-norm residual MLP block (LayerNorm, Linear, GELU, Linear)."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.up = nn.Linear(h, 2 * h)
        self.down = nn.Linear(2 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Head(nn.Module):
    def __init__(self, h: int, v: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.out = nn.Linear(h, v, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class TinyLM(nn.Module):
    """Embedding → blocks → head; ``extra`` adds a block that the forward never calls (an unused unit)."""

    def __init__(self, layers: int = 3, *, unused: bool = False, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block(HIDDEN) for _ in range(layers))
        self.head = Head(HIDDEN, VOCAB)
        self.spare = Block(HIDDEN) if unused else None
        self.temperature: nn.Parameter | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        return logits * self.temperature if self.temperature is not None else logits


def batch(step: int, rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def reference(
    opts: dict[str, Any], world: int = WORLD, steps: int = STEPS, micro: int = MICRO
) -> tuple[list, dict[str, torch.Tensor]]:
    """Single-process AdamW (or ``opts["optimizer"]``, a ``torch.optim`` class name, with
    ``opts["optimizer_params"]``) on the union of every rank's data: losses[step][rank][micro], final params.

    Parameters without a gradient in a step get a zero gradient (the engine's documented semantics)."""
    model = make_model({**opts, "meta": False})
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    wd = opts.get("weight_decay", 0.0)
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    if "make_optimizer" in opts:  # an optimizer (or several behind one step) built on the model
        opt = opts["make_optimizer"](model)
    elif "optimizer" in opts:  # torch's class the engine runs, with the hyperparameters the case gives it
        cls = getattr(torch.optim, opts["optimizer"])
        opt = cls(groups, lr=opts.get("lr", 1e-2), foreach=False, **opts.get("optimizer_params", {}))
    else:
        opt = torch.optim.AdamW(groups, lr=opts.get("lr", 1e-2), betas=(0.9, 0.95), eps=1e-8, foreach=False)
    losses = []
    for s in range(steps):
        if opts.get("schedule"):
            for group in opt.param_groups:
                group["lr"] = schedule(s)
        per_rank = []
        for r in range(world):
            per_micro = []
            for m in range(micro):
                x, y = batch(s, r, m)
                loss = loss_fn(model(x), y) / micro
                loss.backward()
                per_micro.append(loss.item())
            per_rank.append(per_micro)
        losses.append(per_rank)
        for p in model.parameters():
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad /= world
        if opts.get("max_grad_norm"):
            torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], opts["max_grad_norm"]
            )
        opt.step()
        opt.zero_grad()
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def make_model(opts: dict[str, Any]) -> nn.Module:
    if opts.get("model") in ("neox", "llama"):
        from zerotopo.models.neox import GPTNeoX, NeoXConfig

        torch.manual_seed(0)
        # "llama": Llama's switches (RMSNorm, SwiGLU, grouped-query attention, no biases, full rotary)
        llama = dict(
            num_kv_heads=1, intermediate_size=24, rotary_pct=1.0, gpt_j_residual=False, norm="rmsnorm",
            rms_norm_epsilon=1e-6, use_bias_in_norms=False, use_bias_in_attn_linear=False,
            use_bias_in_mlp=False, activation="silu", gated_mlp=True,
        )  # fmt: skip
        cfg = NeoXConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_layers=2,
            num_attention_heads=2,
            max_position_embeddings=16,
            checkpoint_activations=opts.get("checkpoint", False),
            tie_embeddings=opts.get("tied", False),
            **(llama if opts["model"] == "llama" else {}),
        )
        if opts.get("meta"):  # built without storage: parallelize draws the same values unit by unit
            with torch.device("meta"):
                return GPTNeoX(cfg)
        return GPTNeoX(cfg)
    model = TinyLM(unused=opts.get("unused", False))
    if opts.get("tied"):  # the head's projection is the embedding (one Parameter in two units)
        model.head.out.weight = model.embed.weight
    if opts.get("stray"):
        model.temperature = nn.Parameter(torch.tensor([1.5]))  # owned by the root: the root unit
    if opts.get("frozen"):
        model.blocks[1].up.weight.requires_grad_(False)
    return model


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).norm().item() / max(b.float().norm().item(), 1e-12)


def train_worker(rank: int, world: int, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run every case on this rank: train STEPS steps of MICRO micro-batches and report."""
    from zerotopo.comm.ledger import Ledger
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import MixedPrecision, ShardedOptimizer, debug
    from zerotopo.engine.optim import make_scaler
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    topo = load_topology("emulated")
    results = []
    for case in cases:
        plan = load_plan(case["plan"])
        if case.get("plan_overrides"):
            plan = replace(plan, **case["plan_overrides"])
        index = rank
        if case.get("permute"):
            # the launcher's rank order is not topological (like srun --gpu-bind=closest on Frontier)
            index = (rank // 4) * 4 + (3, 1, 2, 0)[rank % 4]
        mesh = build_mesh(topo, plan, topo_index=index)
        ledger = Ledger()
        opts = case.get("opts", {})
        param_dtype = getattr(torch, opts.get("param_dtype", "float32"))
        model = debug.parallelize(
            make_model(opts),
            mesh=mesh,
            mp_policy=MixedPrecision(param_dtype, getattr(torch, opts.get("reduce_dtype", "float32"))),
            options=debug.DebugOptions(
                ledger=ledger,
                sanitize=opts.get("sanitize", True),
                copy_delay_ms=opts.get("copy_delay_ms", 0.0),
                unordered_secondary=opts.get("unordered", False),
            ),
        )
        loss_scale = opts.get("loss_scale", "dynamic")
        optimizer = ShardedOptimizer(
            model,
            opts.get("optimizer", "AdamW"),
            lr=opts.get("lr", 1e-2),
            weight_decay=opts.get("weight_decay", 0.0),
            max_grad_norm=opts.get("max_grad_norm"),
            loss_scale=make_scaler(loss_scale, param_dtype, **(opts.get("loss_scale_options") or {})),
            **(opts.get("optimizer_params") or {}),
        )
        out: dict[str, Any] = {"name": case.get("name", plan.name), "losses": [], "stats": [], "error": None}
        if opts.get("eager_params"):
            optimizer.lazy_param_gather = False
        if opts.get("plain_forward_gathers"):
            # edit the schedule the runtime executes: every forward gather becomes a plain one
            from dataclasses import replace as dc_replace

            steps = model._runtime.steps
            for k, st in steps.items():
                fwd = tuple(dc_replace(c, op="all_gather", dtype="fp32") for c in st.forward)
                steps[k] = dc_replace(st, forward=fwd)
        out["ranges"] = [(u.p_range, u.g_range, u.o_range) for u in model.units]
        out["memory"] = model.memory_report()
        try:
            for s in range(case.get("steps", STEPS)):
                if s == 1:
                    ledger.reset()
                per_micro = []
                for m in range(MICRO):
                    x, y = batch(s, rank, m)
                    scale_boost = opts.get("overflow_at_step") == s
                    loss = loss_fn(model(x), y) / MICRO
                    per_micro.append(loss.item())
                    scaled = model.scale_loss(loss * (1e30 if scale_boost else 1.0))
                    if opts.get("last_backward"):
                        model.set_is_last_backward(m == MICRO - 1)
                    scaled.backward()
                if opts.get("last_backward"):
                    # every unit's step-end reduction was started by the backward, none by the step
                    out.setdefault("started_early", []).append(
                        sum(u.replica_pending is not None for u in model.units)
                    )
                stats = optimizer.step()
                # sharded units' post-step all-gathers still in flight (landed by their next gather)
                out.setdefault("params_in_flight", []).append(
                    sum(u.param_update is not None for u in model.units)
                )
                optimizer.zero_grad()
                if s == 1:
                    out["ledger"] = {
                        (op, tier or ""): b for (op, tier), b in ledger.bytes_by_op().items() if b
                    }
                if opts.get("eval_between"):
                    # An evaluation forward between steps changes nothing, and leaves nothing gathered:
                    # the next step's ledger (checked after step 1) still equals the cost model.
                    with torch.no_grad():
                        model(batch(99, rank, 0)[0])
                out["stats"].append(stats)
                out["losses"].append(per_micro)
        except Exception as exc:  # reported to the parent, which decides whether it was expected
            if not case.get("expect_error"):
                raise
            out["error"] = f"{type(exc).__name__}: {exc}"
            # The other ranks may be blocked in a collective; only raising ranks report, all stop here.
            results.append(out)
            return results
        if opts.get("last_backward"):
            # a further backward after the marked one, before the step, is refused on every rank
            model.set_is_last_backward(True)
            loss_fn(model(batch(0, rank, 0)[0]), batch(0, rank, 0)[1]).backward()
            try:
                loss_fn(model(batch(0, rank, 1)[0]), batch(0, rank, 1)[1]).backward()
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                out["twice_error"] = f"{type(exc).__name__}: {exc}"
            optimizer.zero_grad()
        out["unit_numels"] = model.unit_numels()
        sd = model.full_state_dict()
        out["params"] = sd if rank == 0 else None
        out["nonfinite"] = any(not math.isfinite(v) for per in out["losses"] for v in per)
        model.close()
        results.append(out)
    return results


def checkpoint_worker(rank: int, world: int, plan_name: str) -> dict[str, Any]:
    """Train with gradient accumulation and an LR schedule; checkpoint after step 1 (full fp32 state +
    this rank's optimizer shard), train on, reload, and train the same steps again."""
    import copy

    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import ShardedOptimizer, debug
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology

    mesh = build_mesh(load_topology("emulated"), get_preset(plan_name), topo_index=rank)
    model = debug.parallelize(make_model({}), mesh=mesh, options=debug.DebugOptions(sanitize=True))
    optimizer = ShardedOptimizer(model, lr=1e-2)

    def run(steps: range) -> list[float]:
        losses = []
        for s in steps:
            optimizer.param_groups[0]["lr"] = schedule(s)
            for m in range(MICRO):
                x, y = batch(s, rank, m)
                loss = loss_fn(model(x), y)
                model.set_is_last_backward(m == MICRO - 1)
                model.scale_loss(loss / MICRO).backward()
                losses.append(loss.item())
            optimizer.step()
            optimizer.zero_grad()
        return losses

    first = run(range(2))
    saved = (model.full_state_dict(), copy.deepcopy(optimizer.state_dict()))
    after = run(range(2, STEPS))
    final = model.full_state_dict()
    model.load_full_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    again = run(range(2, STEPS))
    return {
        "losses": first + after,
        "again": again,
        "same_final": all(torch.equal(final[k], v) for k, v in model.full_state_dict().items()),
    }


def schedule(step: int) -> float:
    """A warm-up then decay LR schedule, set through ``param_groups[0]["lr"]``."""
    return 1e-2 * min(1.0, (step + 1) / 2) * (0.5 ** max(0, step - 2))
