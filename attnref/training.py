"""
What the two reference CLIs share around their models: the debug state (doc/formats.md "Debug
state"), the training loop on token shards, validation, sampling, and the flags and run
sequence of both scripts. A model here is SAN or GPT2 (cfg, ordered_parameters,
forward(idx, targets) -> (logits, (loss, ce, lse_sq))), with its optimizer factory.
"""

import argparse
import time

import numpy as np
import torch

from attnref.container import KIND_DEBUG_STATE, save_checkpoint, write_container
from attnref.data import REGION_NAMES, ShardLoader, debug_batch
from attnref.ops import document_ids, loss_mask
from attnref.optim import clip_grad_norm, group_lrs
from attnref.tokenizer import decode_with_bin, read_tokenizer_bin  # attnref/tokenizer.py (on the path by attnref.data)

VAL_BATCHES = 8  # the CUDA trainers' --val-batches default


# -----------------------------------------------------------------------------------------
# Debug state

def train_steps(model, opt, x, y, n_steps, total_steps):
    """n_steps optimizer steps on one fixed batch; returns per-step records of the loss
    before the update, the pre-clip grad norm and the two group rates."""
    rec = {"loss": [], "grad_norm": [], "lr_matrix": [], "lr_other": []}
    for s in range(n_steps):
        model.zero_grad(set_to_none=True)
        _, (loss, _, _) = model(x, y)
        loss.backward()
        norm = clip_grad_norm(model.ordered_parameters(), opt.oc.grad_clip)
        lr_m, lr_o = group_lrs(opt.oc, opt.step_count, total_steps)
        opt.step(lr_m, lr_o)
        for k, v in zip(rec, (loss.item(), norm, lr_m, lr_o)):
            rec[k].append(v)
    return rec


def write_debug_state(path, model, oc, make_optimizer, seed=42, batch_size=4, n_steps=10, schedule_steps=None,
                      precision="fp64"):
    """Debug state of doc/formats.md for `model` (fp32, initialised): config + optimizer
    settings, initial parameters, one batch, logits, loss, all gradients, an n_steps
    trajectory and the final parameters. Everything is computed in `precision` (fp64 by
    default: a more exact reference for the fp32 CUDA build) from the fp32 initial
    parameters, and stored as fp32. Returns (loss, trajectory records)."""
    schedule_steps = schedule_steps or n_steps
    cfg = model.cfg
    init_params = [(n, p.detach().clone()) for n, p in model.ordered_parameters()]
    # model state that is not a parameter (the SAN's fixed QK input): stored after the parameters
    state = [(n, t.detach().clone(), dt) for n, t, dt in (model.state_tensors() if hasattr(model, "state_tensors") else [])]
    if precision == "fp64":
        model = model.double()
    x, y = debug_batch(cfg, batch_size, seed)
    logits, (loss, ce, lse_sq) = model(x, y)
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = [(n, p.grad.detach().clone()) for n, p in model.ordered_parameters()]
    model.zero_grad(set_to_none=True)
    opt = make_optimizer(model, oc)
    rec = train_steps(model, opt, x, y, n_steps, schedule_steps)
    meta = cfg.to_meta() + oc.to_meta() + [
        ("seed", str(seed)), ("debug.batch_size", str(batch_size)), ("debug.steps", str(n_steps)),
        ("debug.schedule_steps", str(schedule_steps)), ("debug.precision", precision)]
    doc = document_ids(x, cfg.bos_id) if cfg.doc_mask else torch.zeros_like(x)
    t = [(n, p, "fp32") for n, p in init_params] + state
    t += [("batch.inputs", x, "int32"), ("batch.targets", y, "int32"),
          ("batch.doc_ids", doc, "int32"), ("batch.loss_mask", loss_mask(y, cfg).long(), "int32"),
          ("logits", logits, "fp32"),
          ("loss", loss.reshape(1), "fp32"), ("loss.ce", ce.reshape(1), "fp32"),
          ("loss.lse_sq", lse_sq.reshape(1), "fp32")]
    t += [("grad." + n, g, "fp32") for n, g in grads]
    t += [("traj." + k, np.array(v, dtype=np.float64), "fp32") for k, v in rec.items()]
    t += [("final." + n, p, "fp32") for n, p in model.ordered_parameters()]
    write_container(path, KIND_DEBUG_STATE, meta, t)
    return loss.item(), rec


# -----------------------------------------------------------------------------------------
# Evaluation and sampling

@torch.no_grad()
def evaluate_regions(model, loader, n_batches=VAL_BATCHES):
    """(validation loss, {region name: loss}) over the first n_batches batches: cross-entropy
    only (the z-loss term is not part of it), token-weighted: the sum over every counted
    target / their number. Per region of the target token when the shards have region
    sidecars, over the targets whose whole document is in the row (after the row's first
    BOS; with the document mask only, as train_san.cu), as llmc/train/training.h evaluate()."""
    model.eval()
    loader.reset()
    cfg = model.cfg
    ce_sum, count = 0.0, 0
    region_sum, region_count = np.zeros(len(REGION_NAMES)), np.zeros(len(REGION_NAMES), np.int64)
    dev = model.wte.device
    doc_start = cfg.bos_id if getattr(cfg, "doc_mask", False) else None
    for _ in range(n_batches):
        x, y = loader.next_batch()
        x, y = x.to(dev), y.to(dev)
        logits, (_, ce, _) = model(x, y)
        mask = loss_mask(y, cfg)
        n = int(mask.sum())
        ce_sum += ce.item() * n
        count += n
        if loader.regions is None or doc_start is None:
            continue
        V = cfg.vocab_size
        per = torch.nn.functional.cross_entropy(logits[..., :V].double().reshape(-1, V), y.clamp(min=0).reshape(-1),
                                                reduction="none").reshape(y.shape).cpu().numpy()
        whole = (torch.cumsum((x == doc_start).long(), dim=1) > 0)
        counted = (mask & whole).cpu().numpy()
        labels = loader.regions[:, 1:]  # the target token's region
        for g in range(len(REGION_NAMES)):
            sel = counted & (labels == g)
            region_sum[g] += per[sel].sum()
            region_count[g] += int(sel.sum())
    model.train()
    regions = {REGION_NAMES[g]: region_sum[g] / region_count[g] for g in range(len(REGION_NAMES))
               if region_count[g] > 0}
    return ce_sum / max(count, 1), regions


def evaluate(model, loader, n_batches=VAL_BATCHES):
    """The validation loss of evaluate_regions."""
    return evaluate_regions(model, loader, n_batches)[0]


def format_val(loss, regions):
    """"val loss X | query Y | ..." as train_san.cu prints it."""
    return f"val loss {loss:.4f}" + "".join(f" | {name} {value:.4f}" for name, value in regions.items())


@torch.no_grad()
def sample(model, prompt, n_tokens, temperature=1.0, seed=0):
    """Multinomial sampling over the real vocabulary; the context is cropped to seq_len."""
    g = torch.Generator(device=model.wte.device).manual_seed(seed)
    cfg = model.cfg
    toks = list(prompt)
    for _ in range(n_tokens):
        ctx = torch.tensor([toks[-cfg.seq_len:]], device=model.wte.device)
        logits, _ = model(ctx)
        lg = logits[0, -1, : cfg.vocab_size].double() / max(temperature, 1e-6)
        toks.append(int(torch.multinomial(torch.softmax(lg, -1), 1, generator=g)))
    return toks


# -----------------------------------------------------------------------------------------
# The command line both scripts share

def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def model_flag(field):
    """The command-line flag of a model config field, as train_san.cu names it (the model's
    context is --max-seq-len; --seq-len is the length of the rows trained and validated on)."""
    return "--max-seq-len" if field == "seq_len" else "--" + field.replace("_", "-")


def load_tokenizer_bin(path):
    """The tokenizer .bin as attnref/tokenizer.py reads it, or a ValueError naming the file."""
    try:
        return read_tokenizer_bin(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"--tokenizer {path}: not a readable tokenizer .bin ({e}); attnref/tokenizer.py writes "
                         f"them (data/offline/tokenizer.bin)") from None


def decode_sample(tb, ids):
    """Text of token ids with the tokenizer .bin table (llmc/data/tokenizer.h's decoding; an
    incomplete UTF-8 character at the end is held back, other broken bytes become U+FFFD)."""
    data = decode_with_bin(tb, ids)
    for cut in range(min(3, len(data)), 0, -1):  # a character cut short by the end: hold it back
        lead = data[-cut]
        need = 2 if lead >> 5 == 0x6 else 3 if lead >> 4 == 0xE else 4 if lead >> 3 == 0x1E else 0
        if need > cut and all(b >> 6 == 0x2 for b in data[-cut + 1:]):
            data = data[:-cut]
            break
    return data.decode("utf-8", errors="replace")




def base_parser(description, presets):
    """(parser, model-config group): the start both scripts' parsers share."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(presets), help="base config; flags below override it")
    return p, p.add_argument_group("model config (default: the preset's value)")


def add_run_args(r):
    """The flags of the run group that both scripts have (argparse group `r`)."""
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--device", default="auto", help="auto | cpu | cuda")
    r.add_argument("--write-debug-state", metavar="PATH", help="write a debug state and exit")
    r.add_argument("--debug-batch-size", type=int, default=4)
    r.add_argument("--debug-steps", type=int, default=10)
    r.add_argument("--debug-schedule-steps", type=int, default=0, help="schedule length (0: --debug-steps)")
    r.add_argument("--debug-precision", choices=("fp32", "fp64"), default="fp64")
    r.add_argument("--load-checkpoint", metavar="PATH", help="model (and optimizer state) to start from")
    r.add_argument("--init-from", metavar="PATH",
                   help="model config and parameters to start from, the optimizer fresh (as the C++ trainers)")
    r.add_argument("--save-checkpoint", metavar="PATH", help="checkpoint written at the end")
    r.add_argument("--train-data", metavar="GLOB", help="training shards (llm.c format)")
    r.add_argument("--val-data", metavar="GLOB", help="validation shards")
    r.add_argument("--steps", type=int, default=0, help="optimizer steps (0: no training)")
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--seq-len", dest="row_len", type=int, default=0,
                   help="tokens per row (0: the model's context, --max-seq-len)")
    r.add_argument("--val-every", type=int, default=50)
    r.add_argument("--val-batches", type=int, default=VAL_BATCHES)
    r.add_argument("--sample-tokens", type=int, default=0, help="tokens to sample at the end (printed as ids)")


def row_length(args, cfg):
    """Tokens per row: --seq-len, or the model's context; a ValueError when it does not fit."""
    T = args.row_len or cfg.seq_len
    if not 0 < T <= cfg.seq_len:
        raise ValueError(f"--seq-len {args.row_len}: rows must be 1 .. {cfg.seq_len} tokens (the model's context)")
    return T


def print_model(cfg, counts, flops):
    """The config line and the parameter / FLOP line every run starts with."""
    total, nonemb = counts
    print(f"config: {' '.join(f'{k}={v}' for k, v in cfg.to_meta())}")
    print(f"parameters: {total:,} total, {nonemb:,} non-embedding; {flops / 1e6:.2f} MFLOPs/token")


def debug_state_from_args(args, model, oc, make_optimizer):
    """--write-debug-state: writes it from the flags and prints its loss and trajectory."""
    loss, rec = write_debug_state(args.write_debug_state, model, oc, make_optimizer, args.seed,
                                  args.debug_batch_size, args.debug_steps, args.debug_schedule_steps or None,
                                  args.debug_precision)
    print(f"debug state: {args.write_debug_state}  loss {loss:.6f}  "
          f"trajectory {' '.join(f'{v:.4f}' for v in rec['loss'])}")


def train_and_validate(args, model, oc, make_optimizer, step0, resume_tensors, T):
    """--steps optimizer steps on --train-data (gradient accumulation over --grad-accum
    micro-batches where the script has it), validation every --val-every steps and at the
    end, then --save-checkpoint. resume_tensors: a checkpoint's optimizer state, or None.
    Returns the step reached; raises ValueError on bad flags."""
    device = model.wte.device
    B, accum = args.batch_size, getattr(args, "grad_accum", 1)
    val = ShardLoader(args.val_data, B, T, model.cfg.vocab_size) if args.val_data else None
    opt = None
    if args.steps > 0:
        if not args.train_data:
            raise ValueError("--steps needs --train-data")
        train = ShardLoader(args.train_data, B, T, model.cfg.vocab_size)
        opt = make_optimizer(model, oc)
        if resume_tensors is not None:
            opt.load_state_tensors(resume_tensors, step0, args.load_checkpoint)
        total_steps = step0 + args.steps
        print(f"optimizer: {' '.join(f'{k}={v}' for k, v in oc.to_meta())}")
        # the speed path (train_san.py --autocast bf16 --compile 1): the compiled module shares
        # the model's parameters, so the optimizer, validation and checkpoints see the same ones
        forward = torch.compile(model) if getattr(args, "compile", 0) else model
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=getattr(args, "autocast", "off") == "bf16")
        for step in range(step0, total_steps):
            if val and (step % args.val_every == 0):
                print(f"step {step:5d} | {format_val(*evaluate_regions(model, val, args.val_batches))}")
            t0 = time.time()
            model.zero_grad(set_to_none=True)
            loss_acc = 0.0
            for _ in range(accum):
                x, y = train.next_batch()
                with autocast:
                    _, (loss, _, _) = forward(x.to(device), y.to(device))
                (loss / accum).backward()
                loss_acc += loss.item() / accum
            norm = clip_grad_norm(model.ordered_parameters(), oc.grad_clip)
            lr_m, lr_o = group_lrs(oc, step, total_steps)
            opt.step(lr_m, lr_o)
            dt = time.time() - t0
            print(f"step {step + 1:5d}/{total_steps} | loss {loss_acc:.4f} | lr {lr_m:.3e}/{lr_o:.3e} | "
                  f"norm {norm:.3f} | {dt * 1000:.0f} ms | {B * T * accum / dt:.0f} tok/s")
        step0 = total_steps
        if val:
            print(f"step {step0:5d} | {format_val(*evaluate_regions(model, val, args.val_batches))}")
    elif val:
        print(format_val(*evaluate_regions(model, val, args.val_batches)))
    if args.save_checkpoint:
        save_checkpoint(args.save_checkpoint, model, step0, opt)
        print(f"checkpoint: {args.save_checkpoint}")
    return step0


def print_sample(args, model, tb):
    """--sample-tokens tokens from BOS, as ids and, with a tokenizer, as text."""
    if args.sample_tokens > 0:
        toks = sample(model, [model.cfg.bos_id], args.sample_tokens, seed=args.seed)
        print("sample (token ids):", " ".join(map(str, toks)))
        if tb is not None:
            print("sample (text):", decode_sample(tb, toks))
