"""DDP and FSDP under torchrun: 2 CPU processes (gloo) match one process with the same config (the
same global batch and gradient accumulation): weights, and the periodic evaluations, which use the
same sample."""

import os
import runpy
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.slow  # two torchrun processes per test

WORKER = textwrap.dedent('''
    import sys
    import torch
    from torch import nn
    from cemlib.train.config import ExperimentConfig, OptimConfig, TrainConfig
    from cemlib.train.batches import TokenBatches
    from cemlib.train.trainer import Trainer

    V, L = 11, 10

    class TinyLM(nn.Module):
        def __init__(self, d=8):
            super().__init__()
            self.emb = nn.Embedding(V, d)
            self.mix = nn.Linear(2 * d, d)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, V, bias=False)

        def forward(self, idx):
            h = self.emb(idx)
            prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
            return self.head(self.norm(h + torch.tanh(self.mix(torch.cat([h, prev], -1)))))

    def run(out_dir, grad_accum, strategy="ddp"):
        torch.manual_seed(0)
        tokens = torch.randint(0, V, (2000,), generator=torch.Generator().manual_seed(1))
        cfg = ExperimentConfig("tiny-ddp", "test", optim=OptimConfig(lr=3e-2, warmup_steps=2),
                               train=TrainConfig(max_steps=8, batch_size=8, grad_accum=grad_accum,
                                                 context_length=L, eval_interval=4, eval_batches=3,
                                                 log_interval=1, seed=3))
        model = TinyLM().double()
        trainer = Trainer(model, TokenBatches(tokens[:1600], L, 3, "train"),
                          TokenBatches(tokens[1600:], L, 4, "val"), cfg, out_dir=out_dir, verbose=False,
                          strategy=strategy)
        res = trainer.fit()
        if trainer.dist.is_main:
            torch.save(torch.load(f"{out_dir}/last.pt", weights_only=True)["model"], f"{out_dir}/weights.pt")
        return res, trainer

    if __name__ == "__main__":
        run(sys.argv[1], grad_accum=int(sys.argv[2]), strategy=sys.argv[3])
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
''')


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, global batch 8 as 4 micro-batches of 2 (the DDP runs, with the same config:
    4 micro-batches of 1 per process). It runs in a subprocess with the DDP processes' environment
    (one intra-op thread, the same kernel choice), not inside pytest: float64 round-off of another
    thread count or vector width, amplified by Adam where a gradient is near zero, would otherwise
    decide the comparison (it did, depending on what earlier tests left in this process)."""
    tmp = tmp_path_factory.mktemp("single")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    out = tmp / "out"
    proc = subprocess.run([sys.executable, str(script), str(out), "4", "ddp"], env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = torch.load(out / "weights.pt", weights_only=True)
    history = torch.load(out / "last.pt", weights_only=True)["history"]
    return script, history, weights


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "CI": "1"}


def torchrun(script, out, strategy, grad_accum):
    env = _env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(script), str(out), str(grad_accum), strategy]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return (torch.load(out / "weights.pt", weights_only=True),
            torch.load(out / "last.pt", weights_only=True))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_cpu_processes_match_single_process(single, tmp_path, strategy):
    script, history_single, w_single = single
    weights, ckpt = torchrun(script, tmp_path / strategy, strategy, grad_accum=4)
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    assert list(weights) == list(w_single)
    for name, w in w_single.items():
        torch.testing.assert_close(weights[name], w, rtol=1e-10, atol=1e-12, msg=name)
    # the weights moved, so the match is not the shared initialisation
    torch.manual_seed(0)
    init = runpy.run_path(str(script))["TinyLM"]().double()
    assert not torch.allclose(init.head.weight, weights["head.weight"], atol=1e-3)
    losses = [(e["train_loss"], e["val_loss"]) for e in ckpt["history"]["eval"]]
    ref = [(e["train_loss"], e["val_loss"]) for e in history_single["eval"]]
    assert len(losses) == 3
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=1e-10, atol=1e-12)
