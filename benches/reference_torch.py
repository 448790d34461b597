"""The reference's training step in PyTorch, for side-by-side throughput ratios.

Not part of the build or CI: it needs `pip install torch`. It trains the cifar_baseline host (kasmina §6.1)
the way esper-lite does on a CPU (simic §1.1, §1.3 A): one model and one set of SGD optimisers per env, a
Python loop over the envs, per env forward, mean cross-entropy, backward, the host and each seed clipped
separately to global norm 1.0, SGD steps (host: lr 0.01, momentum 0.9, weight decay 5e-4; seeds: lr 0.01,
momentum 0.9), loss and correct count accumulated per env and read once per step.

With `--seeds` each env carries the forced state of `esper-ecs bench`: conv_light at r0c0, attention at
r0c1, conv_heavy at r0c2 (kasmina §7.1), BLENDING with ADD held at alpha 0.5, the seed input detached
(kasmina §4.3, §5.1).

    python benches/reference_torch.py --envs 16 --batch-per-env 512 --threads 2 --seeds

prints the median milliseconds per step and the training images per second; compare with
`esper-ecs bench --envs 16 --batch-per-env 512 --train-batches 1 --test-per-env 512` (tier 1) run
beside it on the same cores.
"""

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def group_count(channels):
    """GroupNorm groups (kasmina §7): first of 32..1 dividing C with >= 16 channels per group."""
    for g in (32, 16, 8, 4, 2, 1):
        if channels % g == 0 and channels // g >= 16:
            return g
    for g in (32, 16, 8, 4, 2, 1):
        if channels % g == 0:
            return g
    return 1


class ConvLight(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.norm = nn.GroupNorm(group_count(c), c)

    def forward(self, x):
        return x + F.relu(self.norm(self.conv(x)))


class ConvHeavy(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(group_count(c), c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(group_count(c), c)

    def forward(self, x):
        h = F.relu(self.norm1(self.conv1(x)))
        return x + F.relu(self.norm2(self.conv2(h)))


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        r = max(1, c // 4)
        self.down = nn.Linear(c, r, bias=False)
        self.up = nn.Linear(r, c)
        nn.init.zeros_(self.up.weight)
        nn.init.constant_(self.up.bias, 3.0)

    def forward(self, x):
        scale = torch.sigmoid(self.up(F.relu(self.down(x.mean(dim=(2, 3))))))
        return x * scale[:, :, None, None]


class Slot(nn.Module):
    """A BLENDING seed with ADD at alpha 0.5; the seed sees a detached input (CNN isolation)."""

    def __init__(self, seed, alpha):
        super().__init__()
        self.seed = seed
        self.alpha = alpha

    def forward(self, h):
        s = self.seed(h.detach())
        return torch.lerp(h, s, self.alpha)


class Host(nn.Module):
    """cifar_baseline: three conv-BN-ReLU blocks (8, 16, 32 channels), a 2x2 max-pool after each, GAP, linear."""

    def __init__(self, seeds):
        super().__init__()
        widths = [3, 8, 16, 32]
        self.convs = nn.ModuleList(nn.Conv2d(widths[i], widths[i + 1], 3, padding=1, bias=False) for i in range(3))
        self.norms = nn.ModuleList(nn.BatchNorm2d(widths[i + 1]) for i in range(3))
        self.head = nn.Linear(32, 10)
        blueprints = [ConvLight, Attention, ConvHeavy]
        self.slots = nn.ModuleList(Slot(blueprints[i](widths[i + 1]), 0.5) for i in range(3)) if seeds else None

    def host_parameters(self):
        return list(self.convs.parameters()) + list(self.norms.parameters()) + list(self.head.parameters())

    def forward(self, x):
        for i in range(3):
            x = F.relu(self.norms[i](self.convs[i](x)))
            if self.slots is not None:
                x = self.slots[i](x)
            x = F.max_pool2d(x, 2)
        return self.head(x.mean(dim=(2, 3)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--batch-per-env", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", action="store_true", help="three BLENDING seeds per env (the bench's forced state)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models, host_opts, seed_opts = [], [], []
    for _ in range(args.envs):
        model = Host(args.seeds).train()
        models.append(model)
        host_opts.append(torch.optim.SGD(model.host_parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4))
        seed_opts.append(
            [torch.optim.SGD(slot.seed.parameters(), lr=0.01, momentum=0.9) for slot in model.slots]
            if args.seeds
            else []
        )
    images = torch.randn(args.envs, args.batch_per_env, 3, 32, 32)
    labels = torch.randint(0, 10, (args.envs, args.batch_per_env))

    def step():
        loss_sums = torch.zeros(args.envs)
        correct = torch.zeros(args.envs, dtype=torch.long)
        for e in range(args.envs):
            model = models[e]
            host_opts[e].zero_grad(set_to_none=True)
            for opt in seed_opts[e]:
                opt.zero_grad(set_to_none=True)
            logits = model(images[e])
            loss = F.cross_entropy(logits, labels[e])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.host_parameters(), 1.0)
            if args.seeds:
                for slot in model.slots:
                    torch.nn.utils.clip_grad_norm_(slot.seed.parameters(), 1.0)
            host_opts[e].step()
            for opt in seed_opts[e]:
                opt.step()
            with torch.no_grad():
                loss_sums[e] += loss.detach()
                correct[e] += (logits.argmax(dim=1) == labels[e]).sum()
        return loss_sums.tolist(), correct.tolist()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    images_per_step = args.envs * args.batch_per_env
    print(
        f"reference (torch {torch.__version__}, {args.threads} threads), {args.envs} envs x "
        f"{args.batch_per_env} images, {'three seeds' if args.seeds else 'no seeds'}: "
        f"{median * 1000:.1f} ms/step (min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}), "
        f"{images_per_step / median:.0f} train images/s"
    )


if __name__ == "__main__":
    main()
