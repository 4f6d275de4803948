"""Train a small GPT built from Transformer Engine's TransformerLayer with mask-exact FP8 attention,
and check that the trained model is causal, bit for bit, through the whole model.

    python examples/gpt_fp8_causal.py --check-causality          # defaults: see examples/README.md

The model: token embedding -> N x te.pytorch.TransformerLayer(self_attn_mask_type="causal",
attn_input_format="bshd") -> LayerNorm -> LM head. The data: synthetic sequences, each a random
pattern of 8 to 32 tokens repeated, so that next-token prediction is learnable in context: the
loss starts at ln(vocab) and drops once the model learns to copy the pattern (its first period,
8 to 32 of the tokens, stays unpredictable). At the defaults 300 steps are not enough for that
(on the H200 the loss went from 8.44 to 8.37, ln(vocab) = 8.32): the example shows the recipes,
the speed and the causality check, not convergence; --steps trains longer.

Recipes (--linear-recipe for the Linear layers of every TransformerLayer, --attention-recipe for
its DotProductAttention; docs/te_integration.md, "A model that is causal end to end"):

  auto (default)  sm100+: MXFP8BlockScaling(fp8_dpa=True) for both (per-token 1x32 blocks in the
                  Linear forward, mask-exact MXFP8 attention). sm90/sm89: Linear layers under
                  Float8BlockScaling (1x128 blocks inside one token) where TE supports it
                  (CUDA >= 12.9), else BF16, and attention under Float8CurrentScaling(fp8_dpa=True),
                  mask-exact, given to each DotProductAttention as its own recipe (a nested autocast).
  current         Float8CurrentScaling for the Linear layers too: their activations are quantized
                  with one amax over all tokens of the batch, so the model is NOT causal
                  (--check-causality shows where the prefix changes first).

--check-causality: after training, replace the tokens at positions >= --prefix-len of a batch by
other random tokens and compare the outputs of every layer and the logits at positions
< --prefix-len bit for bit (eval mode, no dropout). Exit status 1 if any prefix output changed.
"""

import argparse
import contextlib
import dataclasses
import functools
import math
import sys
import time
import warnings
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

LINEAR_RECIPES = ("auto", "blockwise", "mxfp8", "current", "bf16")
ATTENTION_RECIPES = ("auto", "current", "mxfp8", "bf16")
MXFP8_NATIVE = (10, 0)
CAUSAL_LINEAR = {"blockwise", "mxfp8", "bf16"}  # activation scales never reduce over tokens
HEAD_DIMS = (64, 128)  # the mask-exact kernels' head dims


# ---------------------------------------------------------------------------------------------
# Arguments


def _positive(kind: type, name: str, allow_zero: bool = False) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected a number, got {text!r}") from None
        if value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(
                f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {text}"
            )
        return value

    return parse


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpt_fp8_causal.py",
        description="Train a small GPT of TE TransformerLayers with mask-exact FP8 attention on"
        " synthetic data, then optionally check it is causal bit for bit.",
    )
    p.add_argument("--steps", type=_positive(int, "--steps", True), default=300,
                   help="training steps (default 300; 0 with --check-causality checks the"
                   " initialized model)")  # fmt: skip
    p.add_argument("--batch-size", type=_positive(int, "--batch-size"), default=8,
                   help="sequences per step (default 8)")  # fmt: skip
    p.add_argument("--seq-len", type=_positive(int, "--seq-len"), default=256,
                   help="tokens per sequence, a multiple of 16 (default 256)")  # fmt: skip
    p.add_argument("--hidden-size", type=_positive(int, "--hidden-size"), default=512,
                   help="model width, a multiple of 128 (default 512)")  # fmt: skip
    p.add_argument(
        "--num-heads",
        type=_positive(int, "--num-heads"),
        default=4,
        help="attention heads; hidden-size / num-heads must be 64 or 128 (default 4)",
    )
    p.add_argument("--num-layers", type=_positive(int, "--num-layers"), default=4,
                   help="TransformerLayers (default 4)")  # fmt: skip
    p.add_argument(
        "--vocab-size",
        type=_positive(int, "--vocab-size"),
        default=4096,
        help="vocabulary of the synthetic data, a multiple of 16 (default 4096)",
    )
    p.add_argument("--lr", type=_positive(float, "--lr"), default=1e-3,
                   help="peak learning rate of AdamW (default 1e-3)")  # fmt: skip
    p.add_argument("--warmup", type=_positive(int, "--warmup", True), default=30,
                   help="linear warmup steps (default 30)")  # fmt: skip
    p.add_argument("--seed", type=_positive(int, "--seed", True), default=0,
                   help="seed of the weights and the data (default 0)")  # fmt: skip
    p.add_argument(
        "--linear-recipe",
        choices=LINEAR_RECIPES,
        default="auto",
        help="recipe of the Linear layers (default auto: see the module doc)",
    )
    p.add_argument("--attention-recipe", choices=ATTENTION_RECIPES, default="auto",
                   help="recipe of DotProductAttention (default auto: mxfp8 on sm100+, else"
                   " current; both mask-exact)")  # fmt: skip
    p.add_argument("--check-causality", action="store_true",
                   help="after training, perturb the future tokens of a batch and compare every"
                   " layer's prefix outputs bit for bit")  # fmt: skip
    p.add_argument("--prefix-len", type=_positive(int, "--prefix-len"), default=None,
                   help="positions < this are the prefix (default seq-len / 2 + 15, inside a"
                   " 32-token MXFP8 block)")  # fmt: skip
    p.add_argument(
        "--log-every",
        type=_positive(int, "--log-every"),
        default=25,
        help="steps between progress lines when tqdm is not installed (default 25)",
    )
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The arguments, with the shape constraints of FP8 GEMMs and the kernels checked."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.seq_len % 16:
        parser.error(f"--seq-len must be a multiple of 16 (FP8 GEMMs), got {args.seq_len}")
    if args.hidden_size % 128:
        parser.error(f"--hidden-size must be a multiple of 128, got {args.hidden_size}")
    if args.vocab_size % 16 or args.vocab_size < 64:
        parser.error(f"--vocab-size must be a multiple of 16 and >= 64, got {args.vocab_size}")
    if args.hidden_size % args.num_heads or args.hidden_size // args.num_heads not in HEAD_DIMS:
        parser.error(
            f"--hidden-size / --num-heads must be one of {HEAD_DIMS} (mask-exact kernels), got"
            f" {args.hidden_size} / {args.num_heads}"
        )
    if args.prefix_len is None:
        args.prefix_len = min(args.seq_len // 2 + 15, args.seq_len - 1)
    if not 1 <= args.prefix_len < args.seq_len:
        parser.error(f"--prefix-len must be in [1, seq-len), got {args.prefix_len}")
    if args.steps == 0 and not args.check_causality:
        parser.error("--steps 0 trains nothing; add --check-causality or give steps")
    return args


# ---------------------------------------------------------------------------------------------
# Recipes: which combination, and is the model causal end to end?


@dataclasses.dataclass(frozen=True)
class RecipePlan:
    linear: str  # "blockwise", "mxfp8", "current" or "bf16"
    attention: str  # "current", "mxfp8" or "bf16"
    causal: bool  # is every FP8 component causal (forward)?
    note: str = ""

    def describe(self) -> str:
        names = {
            "blockwise": "Float8BlockScaling (1x128 blocks per token)",
            "mxfp8": "MXFP8BlockScaling (1x32 blocks per token)",
            "current": "Float8CurrentScaling (one amax over all tokens)",
            "bf16": "BF16",
        }
        attention = {
            "current": "Float8CurrentScaling(fp8_dpa=True), mask-exact",
            "mxfp8": "MXFP8BlockScaling(fp8_dpa=True), mask-exact",
            "bf16": "BF16",
        }[self.attention]
        verdict = "causal end to end" if self.causal else "NOT causal (Linear activation scales)"
        text = f"Linear layers: {names[self.linear]}; attention: {attention}; {verdict}"
        return text + (f"; {self.note}" if self.note else "")


def plan_recipes(
    linear: str, attention: str, capability: Tuple[int, int], block_scaling_supported: bool
) -> RecipePlan:
    """The recipes the example runs on a GPU of `capability` (pure: no TE import)."""
    native_mx = tuple(capability) >= MXFP8_NATIVE
    note = ""
    if attention == "auto":
        attention = "mxfp8" if native_mx else "current"
    if linear == "auto":
        if native_mx:
            linear = "mxfp8"
        elif block_scaling_supported:
            linear = "blockwise"
        else:
            linear = "bf16"
            note = "Float8BlockScaling needs sm90 and CUDA >= 12.9 here, so Linear runs BF16"
    if "mxfp8" in (linear, attention) and not native_mx:
        raise ValueError(
            "MXFP8BlockScaling needs compute capability 10.0 or newer for TE's autocast (on sm90,"
            " MXFP8 attention comes through NVTE_DPA_FP8_RECIPE: docs/te_integration.md)"
        )
    if linear == "blockwise" and not block_scaling_supported:
        raise ValueError("--linear-recipe blockwise: TE reports no FP8 block scaling on this GPU")
    return RecipePlan(linear, attention, linear in CAUSAL_LINEAR, note)


def make_recipe(name: str, fp8_dpa: bool):
    """TE's recipe object for a plan entry (None for BF16)."""
    from transformer_engine.common import recipe as te_recipe

    if name == "bf16":
        return None
    make = {
        "blockwise": te_recipe.Float8BlockScaling,
        "mxfp8": te_recipe.MXFP8BlockScaling,
        "current": te_recipe.Float8CurrentScaling,
    }[name]
    return make(fp8_dpa=fp8_dpa) if fp8_dpa else make()


def attention_under_recipe(dpa: torch.nn.Module, recipe) -> None:
    """Run `dpa` (a DotProductAttention) under its own autocast(recipe): a per-module recipe, as
    TE supports with nested autocast() contexts. The Linear layers keep the outer recipe."""
    forward = dpa.forward

    @functools.wraps(forward)
    def wrapped(*args, **kwargs):
        import transformer_engine.pytorch as te

        with te.autocast(enabled=recipe is not None, recipe=recipe):
            return forward(*args, **kwargs)

    dpa.forward = wrapped


# ---------------------------------------------------------------------------------------------
# Model and data


class GPT(torch.nn.Module):
    """Token + learned position embedding -> layers ([b, s, h] -> [b, s, h]) -> LayerNorm -> head."""

    def __init__(
        self, layers: Sequence[torch.nn.Module], vocab_size: int, hidden_size: int, max_len: int
    ):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, hidden_size)
        self.position = torch.nn.Embedding(max_len, hidden_size)
        self.layers = torch.nn.ModuleList(layers)
        self.norm = torch.nn.LayerNorm(hidden_size)
        self.head = torch.nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position.weight[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build_te_model(args: argparse.Namespace, plan: RecipePlan, device: str = "cuda") -> GPT:
    """The GPT of TE TransformerLayers (needs TE and a GPU)."""
    import transformer_engine.pytorch as te

    layers = [
        te.TransformerLayer(
            hidden_size=args.hidden_size,
            ffn_hidden_size=4 * args.hidden_size,
            num_attention_heads=args.num_heads,
            self_attn_mask_type="causal",
            attn_input_format="bshd",
            hidden_dropout=0.0,
            attention_dropout=0.0,  # dropout in training is not mask-exact (it falls back)
            layer_number=i + 1,
            fuse_qkv_params=True,
            params_dtype=torch.bfloat16,
        )
        for i in range(args.num_layers)
    ]
    if plan.attention != plan.linear:
        recipe = make_recipe(plan.attention, fp8_dpa=True)
        for layer in layers:
            attention_under_recipe(layer.self_attention.core_attention, recipe)
    model = GPT(layers, args.vocab_size, args.hidden_size, args.seq_len)
    return model.to(device=device, dtype=torch.bfloat16)


def model_context(plan: RecipePlan) -> Callable[[], contextlib.AbstractContextManager]:
    """The autocast of every forward: the Linear layers' recipe (attention's when they share it)."""
    import transformer_engine.pytorch as te

    shared = plan.attention == plan.linear
    recipe = make_recipe(plan.linear, fp8_dpa=shared and plan.linear != "bf16")
    return lambda: te.autocast(enabled=recipe is not None, recipe=recipe)


def synthetic_batch(
    gen: torch.Generator, batch: int, seq_len: int, vocab: int, device="cpu"
) -> torch.Tensor:
    """[batch, seq_len + 1] int64: each row a random pattern of 8 to 32 tokens, repeated."""
    rows = []
    for _ in range(batch):
        period = int(torch.randint(8, 33, (1,), generator=gen))
        pattern = torch.randint(0, vocab, (period,), generator=gen)
        rows.append(pattern.repeat(-(-(seq_len + 1) // period))[: seq_len + 1])
    return torch.stack(rows).to(device)


def perturb_future(tokens: torch.Tensor, prefix_len: int, gen: torch.Generator, vocab: int):
    """A copy of tokens [b, s] with every position >= prefix_len replaced by a different token."""
    out = tokens.clone()
    future = out[:, prefix_len:]
    shift = torch.randint(1, vocab, future.shape, generator=gen).to(out.device)
    out[:, prefix_len:] = (future + shift) % vocab  # never the same token
    return out


def prefix_change(base: torch.Tensor, pert: torch.Tensor, prefix_len: int) -> Tuple[float, int]:
    """(max |difference|, number of differing elements) over positions < prefix_len of [b, s, ...]."""
    a, b = base[:, :prefix_len].float(), pert[:, :prefix_len].float()
    differ = (a != b) & ~(torch.isnan(a) & torch.isnan(b))
    diff = (a - b).abs()[differ]
    return (float(diff.max()) if diff.numel() else 0.0), int(differ.sum())


# ---------------------------------------------------------------------------------------------
# Training and the causality check


def progress(total: int, log_every: int, out=sys.stdout):
    """update(step, loss, tokens_per_s) and close(): tqdm's bar if installed, else a line every
    `log_every` steps (and at the last)."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(total=total, unit="step", file=out)

        def update(step, loss, rate):
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", tokens_per_s=f"{rate:,.0f}")

        return update, bar.close

    def update_plain(step, loss, rate):
        if step % log_every == 0 or step == total:
            print(f"step {step}/{total}  loss {loss:.4f}  tokens/s {rate:,.0f}", file=out)

    return update_plain, lambda: None


@dataclasses.dataclass
class TrainResult:
    first_loss: float
    last_loss: float
    tokens_per_s: float


def lr_at(step: int, steps: int, warmup: int, peak: float) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, t))))


def train(
    model: torch.nn.Module,
    batches: Iterator[torch.Tensor],
    steps: int,
    context: Callable[[], contextlib.AbstractContextManager],
    lr: float = 1e-3,
    warmup: int = 30,
    log_every: int = 25,
    out=sys.stdout,
) -> TrainResult:
    """`steps` AdamW steps of next-token cross entropy; prints loss and tokens/s."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    update, close = progress(steps, log_every, out)
    model.train()
    first = last = float("nan")
    tokens = 0
    start = time.perf_counter()
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step - 1, steps, warmup, lr)
        batch = next(batches)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        with context():
            logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        tokens += inputs.numel()
        if step == 1 or step % log_every == 0 or step == steps or _has_tqdm():
            last = float(loss.detach())  # a host sync; without tqdm only at the logged steps
            first = last if step == 1 else first
        rate = tokens / max(time.perf_counter() - start, 1e-9)
        update(step, last, rate)
    close()
    return TrainResult(first, last, tokens / max(time.perf_counter() - start, 1e-9))


@functools.lru_cache(maxsize=None)
def _has_tqdm() -> bool:
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


def check_causality(
    model: GPT,
    tokens: torch.Tensor,
    prefix_len: int,
    context: Callable[[], contextlib.AbstractContextManager],
    gen: torch.Generator,
) -> List[Tuple[str, float, int]]:
    """[(output, max_abs, changed)] for every layer's output and the logits, over positions
    < prefix_len, between `tokens` and a copy whose positions >= prefix_len were replaced."""
    captured: Dict[str, torch.Tensor] = {}
    hooks = [
        layer.register_forward_hook(
            lambda mod, inp, out, name=f"layer {i}": captured.__setitem__(name, _first(out))
        )
        for i, layer in enumerate(model.layers)
    ]
    model.eval()
    try:
        runs = []
        for batch in (tokens, perturb_future(tokens, prefix_len, gen, model.embed.num_embeddings)):
            captured.clear()
            with torch.no_grad(), context():
                logits = model(batch)
            runs.append({**captured, "logits": logits.detach()})
    finally:
        for hook in hooks:
            hook.remove()
    base, pert = runs
    return [(name, *prefix_change(base[name], pert[name], prefix_len)) for name in base]


def _first(output) -> torch.Tensor:
    """A layer's hidden states (TransformerLayer may return a tuple)."""
    return (output[0] if isinstance(output, (tuple, list)) else output).detach()


def format_check(rows: List[Tuple[str, float, int]], prefix_len: int) -> Tuple[str, bool]:
    """(the report, whether every prefix output is bitwise unchanged)."""
    lines = [f"causality check: positions >= {prefix_len} perturbed, positions < {prefix_len}"]
    for name, max_abs, changed in rows:
        verdict = "exact" if changed == 0 else f"CHANGED ({changed} elements, max {max_abs:.3e})"
        lines.append(f"  {name:<10} {verdict}")
    exact = all(changed == 0 for _, _, changed in rows)
    first = next((name for name, _, changed in rows if changed), None)
    lines.append(
        "the model is causal: no prefix output changed, bit for bit"
        if exact
        else f"the model is NOT causal: the prefix changes first at {first}"
    )
    return "\n".join(lines), exact


def _requirements_error() -> Optional[str]:
    if not torch.cuda.is_available():
        return "this example needs a CUDA GPU (sm89 or newer) and Transformer Engine (the fork)"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as err:  # ImportError, or TE's own load errors of its core library
        return f"Transformer Engine does not import ({type(err).__name__}: {err})"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    missing = _requirements_error()
    if missing:
        print(f"gpt_fp8_causal.py: {missing}", file=sys.stderr)
        return 2
    from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.te import status
    from transformer_engine.pytorch.quantization import check_fp8_block_scaling_support

    capability = torch.cuda.get_device_capability()
    try:
        plan = plan_recipes(
            args.linear_recipe,
            args.attention_recipe,
            capability,
            check_fp8_block_scaling_support()[0],
        )
    except ValueError as err:
        print(f"gpt_fp8_causal.py: {err}", file=sys.stderr)
        return 2
    print(f"GPU {torch.cuda.get_device_name()} (sm{capability[0]}{capability[1]})")
    print(f"recipes: {plan.describe()}")
    # Upstream warns when a module's recipe type differs from its previous call's; the
    # attention's own nested recipe does that by design (8 such warnings in a default run).
    warnings.filterwarnings("ignore", message="Recipe type changed", category=UserWarning)
    torch.manual_seed(args.seed)
    model = build_te_model(args, plan)
    context = model_context(plan)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {args.num_layers} x TransformerLayer(hidden {args.hidden_size}, heads"
        f" {args.num_heads}, causal), {params / 1e6:.1f}M parameters; batch {args.batch_size} x"
        f" {args.seq_len} tokens"
    )
    gen = torch.Generator().manual_seed(args.seed)
    batches = iter(
        lambda: synthetic_batch(gen, args.batch_size, args.seq_len, args.vocab_size, "cuda"), None
    )
    status.reset()
    if args.steps:
        result = train(model, batches, args.steps, context, args.lr, args.warmup, args.log_every)
        print(
            f"trained {args.steps} steps: loss {result.first_loss:.4f} -> {result.last_loss:.4f},"
            f" {result.tokens_per_s:,.0f} tokens/s (synthetic, ln(vocab) = "
            f"{math.log(args.vocab_size):.2f})"
        )
    exact = True
    if args.check_causality:
        tokens = synthetic_batch(gen, args.batch_size, args.seq_len, args.vocab_size, "cuda")
        rows = check_causality(model, tokens[:, :-1], args.prefix_len, context, gen)
        report, exact = format_check(rows, args.prefix_len)
        print(report)
    s = status.status()
    print(
        f"mask-exact FP8 attention: {s.mask_exact_calls} calls (kernel backend"
        f" {s.last_kernel_backend}, recipe {s.last_recipe}); fallbacks: {s.fallbacks or 'none'}"
    )
    if plan.attention != "bf16" and not s.ran_mask_exact:
        print("warning: FP8 attention never ran mask-exact (see the fallbacks above)")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
