"""A run's state in a checkpoint: what is saved, whether a checkpoint fits, what a resume changes.

:func:`load` reads the checkpoint on rank 0 and raises CheckpointError on every
rank, with one line naming the file, what is wrong and what to do, when it
cannot be read or was written by another model or sync mode.  On another P,
another compressor or another number of servers it drops the per-rank state
and prints one line on rank 0 saying what changes.
"""

from __future__ import annotations

import math
import os
import re
import sys

from . import checkpoint
from .checkpoint import CheckpointError

__all__ = ["describe", "save", "load"]


def describe(ctx, step):
    """The checkpoint's (and the metrics file's) record of the run at ``step``."""
    c = ctx.cfg
    return {"step": int(step), "sync": c.sync, "model": ctx.model.name, "sizes": ctx.model.sizes,
            "n_params": ctx.model.size, "ranks": ctx.size, "seed": c.seed, "data": c.data,
            "dtype": c.dtype, "compress": c.compress, "batch_size": c.batch_size,
            "servers": c.servers if c.sync == "async" else 0,
            "backup_workers": c.backup_workers, "global_batch": ctx.global_batch,
            "lr_target": ctx.lr_at(c.warmup)}


def save(ctx, mode, step, *, collective=True):
    """Write a checkpoint (collective for every mode but backup's periodic ones)."""
    if collective:
        arrays = mode.gather_state()
    else:  # backup workers: rank 0 holds the parameters and the velocity
        arrays = {"params": ctx.params, "velocity": ctx.opt.velocity} if ctx.rank == 0 else None
    if ctx.rank == 0:
        checkpoint.save(ctx.cfg.checkpoint, arrays, describe(ctx, step))


def _run_label(sync, ranks, servers=0, backup_workers=0):
    if sync == "async":
        return f"P={ranks} async (--servers {servers})"
    if sync == "backup":
        return f"P={ranks} backup (--backup-workers {backup_workers})"
    return f"P={ranks} {sync}"


def _check_fits(ctx, meta):
    """Raise CheckpointError unless the checkpoint holds this run's model and sync mode."""
    path, cfg = ctx.cfg.checkpoint, ctx.cfg
    if meta["n_params"] != ctx.model.size or list(meta["sizes"]) != ctx.model.sizes:
        raise CheckpointError(
            f"checkpoint {path} holds a {meta['model']} model with layers {meta['sizes']} "
            f"({meta['n_params']} parameters); this run builds {ctx.model.name} "
            f"{ctx.model.sizes} ({ctx.model.size}): resume with the --model, --hidden, --params "
            f"and --data it was written with, or pass another --checkpoint")
    if meta["sync"] != cfg.sync:
        was = _run_label(meta["sync"], meta["ranks"], meta.get("servers", 1),
                         meta.get("backup_workers", 0))
        option = {"backup": f"--backup-workers {meta.get('backup_workers', 'B')}",
                  "bsp": "--sync bsp and no --backup-workers"}.get(meta["sync"],
                                                                   f"--sync {meta['sync']}")
        raise CheckpointError(
            f"checkpoint {path} was written by a {was} run; this run is "
            f"{_run_label(cfg.sync, ctx.size, cfg.servers, cfg.backup_workers)}: resume with "
            f"{option}, or pass another --checkpoint")


_RANK_STATE = [  # (key pattern after rank<r>_, what it is, what happens when it is not carried)
    (r"comp\d*_residual", "topk error-feedback residuals", "they start at zero"),
    (r"comp\d*_rng", "qsgd random streams", "they restart from the seed"),
    (r"velocity", "per-rank momentum", "every rank starts from rank 0's"),
    (r"local", "worker batch positions", "workers restart at step/workers"),
]


def _carry(ctx, arrays, meta):
    """Drop the per-rank state this run cannot take; return (arrays, note or None).

    Per-rank state is carried only to the same P, compressor and servers.  The
    note, one line, says what changed: P, the global batch and the learning
    rate, and the per-rank state left behind.
    """
    cfg, path = ctx.cfg, ctx.cfg.checkpoint
    changes = []
    if meta["ranks"] != ctx.size:
        changes.append(f"on P={ctx.size}")
    if meta.get("compress", cfg.compress) != cfg.compress:
        changes.append(f"--compress {meta['compress']} -> {cfg.compress}")
    if cfg.sync == "async" and meta.get("servers", cfg.servers) != cfg.servers:
        changes.append(f"--servers {meta['servers']} -> {cfg.servers}")
    if not changes:
        return arrays, None
    parts = []
    old_workers = meta["ranks"] - meta.get("servers", 0)
    old_batch = meta.get("global_batch", meta.get("batch_size", cfg.batch_size) * old_workers)
    if old_batch != ctx.global_batch:
        parts.append(f"global batch {old_batch} -> {ctx.global_batch}")
    else:
        parts.append(f"global batch kept at {ctx.global_batch}")
    old_lr = meta.get("lr_target", ctx.lr_at(cfg.warmup, old_batch))
    new_lr = ctx.lr_at(cfg.warmup)
    if not math.isclose(old_lr, new_lr, rel_tol=1e-9):
        parts.append(f"learning rate {old_lr:g} -> {new_lr:g} (--lr-scaling {cfg.lr_scaling})")
    else:
        parts.append(f"learning rate kept at {new_lr:g} (--lr-scaling {cfg.lr_scaling})")
    ranks, dropped = set(), []
    for pattern, what, then in _RANK_STATE:
        keys = [k for k in arrays if re.fullmatch(rf"rank\d+_{pattern}", k)]
        if keys:
            ranks.update(int(re.match(r"rank(\d+)_", k).group(1)) for k in keys)
            dropped.append(f"{what} ({then})")
    if dropped:
        parts.append(f"not carried: the {len(ranks)} old ranks' " + " and ".join(dropped))
    else:
        parts.append("no per-rank state to carry")
    arrays = {k: v for k, v in arrays.items() if not k.startswith("rank")}
    note = (f"resuming {path} (step {meta['step']}, written by {meta['ranks']} ranks) "
            f"{', '.join(changes)}: " + "; ".join(parts))
    return arrays, note


def load(ctx, mode):
    """Read the checkpoint on rank 0, check it fits, broadcast it; return the step to continue from.

    A checkpoint that cannot be read or does not fit this run raises
    CheckpointError, with the same one-line message, on every rank.
    """
    path, got = ctx.cfg.checkpoint, None
    if ctx.rank == 0 and os.path.exists(path):
        try:
            arrays, meta = checkpoint.load(path)
            _check_fits(ctx, meta)
            got = (*_carry(ctx, arrays, meta), meta)
        except CheckpointError as exc:
            got = str(exc)
        except Exception as exc:  # metadata of unexpected types
            got = (f"checkpoint {path} holds metadata this run cannot read "
                   f"({type(exc).__name__}: {exc}); {checkpoint.REMEDY}")
    got = ctx.comm.bcast(got, root=0)
    if got is None:
        return 0
    if isinstance(got, str):
        raise CheckpointError(got)
    arrays, note, meta = got
    if note and ctx.rank == 0:
        print(f"mlcomm train: {note}", file=sys.stderr, flush=True)
    try:
        mode.load_state(arrays)
        error = None
    except Exception as exc:
        error = (f"checkpoint {path} holds state this run cannot load "
                 f"({type(exc).__name__}: {exc}); {checkpoint.REMEDY}")
    error = next((e for e in ctx.comm.allgather(error) if e), None)
    if error:
        raise CheckpointError(error)
    return int(meta["step"])
