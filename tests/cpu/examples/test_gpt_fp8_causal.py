"""examples/gpt_fp8_causal.py on the CPU: its arguments, the recipe plan, the data, the training
loop and the causality check, with plain PyTorch layers standing in for TE's TransformerLayer
(the example itself builds TE layers, which need TE's core library and a GPU)."""

import importlib.util
import io
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def example():
    path = ROOT / "examples" / "gpt_fp8_causal.py"
    spec = importlib.util.spec_from_file_location("gpt_fp8_causal", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_defaults(example):
    args = example.parse_args([])
    assert (args.steps, args.batch_size, args.seq_len, args.hidden_size) == (300, 8, 256, 512)
    assert (args.linear_recipe, args.attention_recipe) == ("auto", "auto")
    assert args.prefix_len == 256 // 2 + 15 and not args.check_causality


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--seq-len", "100"], "--seq-len must be a multiple of 16"),
        (["--hidden-size", "320", "--num-heads", "5"], "--hidden-size must be a multiple of 128"),
        (["--num-heads", "2"], "must be one of (64, 128)"),
        (["--steps", "-1"], "--steps must be >= 0"),
        (["--steps", "0"], "--steps 0 trains nothing"),
        (["--batch-size", "0"], "--batch-size must be > 0"),
        (["--lr", "x"], "expected a number"),
        (["--prefix-len", "256"], "--prefix-len must be in [1, seq-len)"),
        (["--linear-recipe", "delayed"], "invalid choice: 'delayed'"),
        (["--vocab-size", "100"], "--vocab-size must be a multiple of 16"),
    ],
)
def test_argument_errors_exit_2_with_one_line(example, argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        example.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and fragment in err


def test_steps_0_with_the_check_is_allowed(example):
    assert example.parse_args(["--steps", "0", "--check-causality"]).steps == 0


def test_recipe_plans(example):
    plan = example.plan_recipes
    hopper = plan("auto", "auto", (9, 0), True)
    assert (hopper.linear, hopper.attention, hopper.causal) == ("blockwise", "current", True)
    old_cuda = plan("auto", "auto", (9, 0), False)
    assert (old_cuda.linear, old_cuda.causal) == ("bf16", True) and "12.9" in old_cuda.note
    blackwell = plan("auto", "auto", (10, 0), True)
    assert (blackwell.linear, blackwell.attention, blackwell.causal) == ("mxfp8", "mxfp8", True)
    leaky = plan("current", "auto", (9, 0), True)
    assert (leaky.linear, leaky.attention, leaky.causal) == ("current", "current", False)
    assert "NOT causal" in leaky.describe() and "mask-exact" in leaky.describe()
    with pytest.raises(ValueError, match="10.0"):
        plan("mxfp8", "auto", (9, 0), True)
    with pytest.raises(ValueError, match="10.0"):
        plan("bf16", "mxfp8", (9, 0), True)
    with pytest.raises(ValueError, match="block scaling"):
        plan("blockwise", "current", (9, 0), False)


def test_synthetic_batches_repeat_a_pattern(example):
    gen = torch.Generator().manual_seed(0)
    batch = example.synthetic_batch(gen, 4, 64, 128)
    assert batch.shape == (4, 65) and batch.dtype == torch.int64
    assert int(batch.min()) >= 0 and int(batch.max()) < 128
    for row in batch:  # some period in 8..32 reproduces the row
        assert any(torch.equal(row[p:], row[:-p]) for p in range(8, 33))
    again = example.synthetic_batch(torch.Generator().manual_seed(0), 4, 64, 128)
    assert torch.equal(batch, again)


def test_perturb_future_changes_every_future_token_only(example):
    tokens = example.synthetic_batch(torch.Generator().manual_seed(1), 3, 64, 128)[:, :-1]
    pert = example.perturb_future(tokens, 20, torch.Generator().manual_seed(2), 128)
    assert torch.equal(pert[:, :20], tokens[:, :20])
    assert bool((pert[:, 20:] != tokens[:, 20:]).all()) and int(pert.max()) < 128


def test_prefix_change(example):
    a = torch.zeros(2, 8, 3)
    b = a.clone()
    b[1, 5, 0] = 0.5  # inside the prefix of 6
    b[0, 7, 2] = 9.0  # outside
    assert example.prefix_change(a, b, 6) == (0.5, 1)
    assert example.prefix_change(a, a.clone(), 8) == (0.0, 0)


class CausalLayer(torch.nn.Module):
    """A pre-norm attention + MLP block with causal SDPA: causal by construction."""

    def __init__(self, h, heads=2, leaky=False):
        super().__init__()
        self.heads, self.leaky = heads, leaky
        self.norm = torch.nn.LayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(h, 2 * h), torch.nn.GELU())
        self.out = torch.nn.Linear(2 * h, h)

    def forward(self, x):
        b, s, h = x.shape
        y = self.norm(x)
        if self.leaky:  # like current scaling: one scale over every token of the batch
            y = y * (0.8 / y.abs().mean())
        q, k, v = self.qkv(y).view(b, s, 3, self.heads, -1).unbind(2)
        att = F.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v)), is_causal=True
        )
        x = x + att.transpose(1, 2).reshape(b, s, h)
        return x + self.out(self.mlp(x))


def _model(example, leaky_layer=None):
    torch.manual_seed(0)
    layers = [CausalLayer(32, leaky=(i == leaky_layer)) for i in range(3)]
    return example.GPT(layers, vocab_size=64, hidden_size=32, max_len=64)


def test_causality_check_passes_a_causal_model(example):
    model = _model(example)
    tokens = example.synthetic_batch(torch.Generator().manual_seed(3), 2, 48, 64)[:, :-1]
    rows = example.check_causality(
        model, tokens, 20, torch.no_grad, torch.Generator().manual_seed(4)
    )
    assert [name for name, _, _ in rows] == ["layer 0", "layer 1", "layer 2", "logits"]
    report, exact = example.format_check(rows, 20)
    assert exact and "the model is causal" in report


def test_causality_check_finds_the_first_leaking_layer(example):
    model = _model(example, leaky_layer=1)
    tokens = example.synthetic_batch(torch.Generator().manual_seed(3), 2, 48, 64)[:, :-1]
    tokens[:, 30] = 7  # a future token the check will change
    rows = example.check_causality(
        model, tokens, 20, torch.no_grad, torch.Generator().manual_seed(4)
    )
    by_name = {name: changed for name, _, changed in rows}
    assert by_name["layer 0"] == 0 and by_name["layer 1"] > 0 and by_name["logits"] > 0
    report, exact = example.format_check(rows, 20)
    assert not exact and "prefix changes first at layer 1" in report


def test_training_loop_lowers_the_loss_and_reports_progress(example, monkeypatch):
    monkeypatch.setattr(example, "_has_tqdm", lambda: False)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the plain progress lines
    model = _model(example)
    gen = torch.Generator().manual_seed(5)

    def counting():  # next token = token + 1 (mod 64): learnable by the MLPs alone
        while True:
            start = torch.randint(0, 64, (8, 1), generator=gen)
            yield (start + torch.arange(65)) % 64

    out = io.StringIO()
    result = example.train(model, counting(), 60, torch.enable_grad, lr=3e-3, warmup=5,
                           log_every=20, out=out)  # fmt: skip
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["20/60", "40/60", "60/60"]
    assert all("loss" in line and "tokens/s" in line for line in lines)
    assert result.last_loss < 0.5 * result.first_loss and result.tokens_per_s > 0


def test_lr_schedule(example):
    assert example.lr_at(0, 100, 10, 1.0) == pytest.approx(0.1)
    assert example.lr_at(9, 100, 10, 1.0) == pytest.approx(1.0)
    assert example.lr_at(99, 100, 10, 1.0) == pytest.approx(0.1, abs=1e-3)


def test_main_without_a_gpu_says_what_it_needs(example, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert example.main(["--steps", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
