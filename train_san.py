"""
train_san.py -- PyTorch reference for the SAN family (attention-only "Simple Attention
Networks" and their SwiGLU-FFN control arm), the numerical twin of train_san.cu: the
command line over the attnref package (attnref/san.py the model, optim.py the optimizers
and schedules, container.py checkpoints and debug states, data.py the shards,
training.py the loop, validation and sampling).

It writes debug states for test_san.cu, trains on llm.c-format token shards (a small loop,
for demos and cross-checks), and loads a checkpoint to evaluate it or sample from it.

Examples:
  python train_san.py --preset tiny --write-debug-state out.bin
  python train_san.py --preset tiny-ffn --norm rms --optimizer adamw --write-debug-state out.bin
  python train_san.py --preset tiny --train-data "data/x/*train*.bin" --val-data "data/x/*val*.bin" \
      --steps 200 --save-checkpoint model.bin
  python train_san.py --load-checkpoint model.bin --val-data "data/x/*val*.bin" --sample-tokens 64
"""

import glob
import math
import sys
from dataclasses import fields

from attnref import training
from attnref.container import ContainerError
from attnref.data import read_shard
from attnref.optim import OptConfig, Optimizer, round_steps
from attnref.presets import read_rates, read_recipe
from attnref.san import (EMBED_SCALES, OUT_INITS, PRESET_FILES, PRESETS, SAN, SANConfig, count_parameters, flops_per_token,
                         load_checkpoint)
from attnref.variants import FIXED_QK_KINDS, KINDS, TAYLOR_NORMS, fixed_input_std


def build_parser():
    p, g = training.base_parser("PyTorch reference for the SAN family (see doc/san-model.md)", PRESETS)
    for f in fields(SANConfig):
        flag = training.model_flag(f.name)
        if f.type in (bool, "bool"):
            g.add_argument(flag, dest=f.name, type=int, choices=(0, 1), default=None)
        elif f.name in ("ffn", "norm", "residual", "attention", "taylor_norm", "embed_scale", "out_init"):
            choices = {"ffn": ("none", "swiglu"), "norm": ("zcn", "rms"),
                       "residual": ("gated", "standard", "rezero", "none"), "attention": KINDS,
                       "taylor_norm": TAYLOR_NORMS, "embed_scale": EMBED_SCALES, "out_init": OUT_INITS}[f.name]
            g.add_argument(flag, dest=f.name, choices=choices, default=None)
        elif f.name == "layout":
            g.add_argument(flag, dest=f.name, default=None,
                           help="layers that keep standard attention: a named layout or a list (doc/deconstructing.md)")
        else:
            g.add_argument(flag, dest=f.name, type=int if f.type in (int, "int") else float, default=None)
    o = p.add_argument_group("optimizer and schedule")
    o.add_argument("--optimizer", choices=("muon", "adamw"), default="muon")
    o.add_argument("--muon-order", choices=("keller", "paper"), default="keller")
    o.add_argument("--lr", type=float, default=None, help="matrix-group peak rate (muon 0.02, adamw 6e-4)")
    o.add_argument("--lr-other", type=float, default=None,
                   help="non-matrix-group peak rate (default: the model's under muon, presets/; adamw: same as --lr)")
    o.add_argument("--lr-scale-gpus", type=int, default=1,
                   help="scale rates for N GPUs: AdamW rates x N, Muon rate x sqrt(N)")
    for f in fields(OptConfig):
        if f.name in ("optimizer", "muon_order", "lr", "lr_other"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name == "schedule":
            o.add_argument(flag, choices=("wsd", "cosine", "linear", "constant"), default=f.default)
        else:
            o.add_argument(flag, type=type(f.default), default=f.default)
    r = p.add_argument_group("run")
    training.add_run_args(r)
    r.add_argument("--grad-accum", type=int, default=0,
                   help="micro-batches per step (0: --global-batch / --batch-size, or 1)")
    r.add_argument("--global-batch", type=int, default=0, help="rows per optimizer step (0: batch-size x grad-accum)")
    r.add_argument("--paper-setup", type=int, choices=(0, 1), default=0,
                   help="1: the SAN paper's recipe as defaults (doc/san-model.md 'Paper setup'); flags given win")
    r.add_argument("--deconstructing-setup", type=int, choices=(0, 1), default=0,
                   help="1: Deconstructing Attention's recipe as defaults (doc/deconstructing.md 'Recipe'); flags "
                        "given win")
    r.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer .bin (attnref/tokenizer.py, as the C++ trainers read it): sets the vocabulary "
                        "size and decodes the sample")
    r.add_argument("--attn-impl", choices=("explicit", "sdpa", "fast"), default="explicit",
                   help="explicit: the reference maths; sdpa: the cross-check; fast: SDPA flash (is_causal) "
                        "or FlexAttention (document mask), the speed path scripts/bench_gpu.sh measures")
    r.add_argument("--autocast", choices=("off", "bf16"), default="off",
                   help="bf16: train under torch.autocast (the speed path; the reference numerics are fp32)")
    r.add_argument("--compile", type=int, choices=(0, 1), default=0, help="1: torch.compile the training forward")
    r.add_argument("--skip-nonstandard", choices=("none", "attention", "block"), default="none",
                   help="evaluation of a trained model: leave out the non-standard layers' attention sub-layers or "
                        "whole blocks (doc/deconstructing.md)")
    return p


def config_from_args(args):
    kw = dict(PRESETS[args.preset])
    for f in fields(SANConfig):
        v = getattr(args, f.name)
        if v is not None:
            kw[f.name] = bool(v) if f.type in (bool, "bool") else v
    return SANConfig(**kw)


def default_rates(cfg):
    """The default per-device peak rates of this model: (Muon, AdamW, AdamW side of Muon). A small
    preset's model at the vocabulary it was swept at (its config but for the context and BOS id,
    which the data set) has the swept rates of its preset file (swept-*); every other model the
    SAN paper's locked rates for its arm (presets/rates/san-paper.conf; as train_san.cu default_rates)."""
    for name, preset in PRESET_FILES.items():
        for s in preset.swept:
            kw = dict(PRESETS[name], ffn=s.ffn, vocab_size=s.vocab_size, seq_len=cfg.seq_len, bos_id=cfg.bos_id)
            if cfg.vocab_size == s.vocab_size and SANConfig(**kw) == cfg:
                return s.muon, s.adamw, s.muon_other
    locked = read_rates("san-paper", "ffn" if cfg.ffn != "none" else "san")
    return locked.muon, locked.adamw, locked.muon_other


def opt_from_args(args, cfg):
    muon_rate, adamw_rate, muon_other = default_rates(cfg)
    lr = args.lr if args.lr is not None else (muon_rate if args.optimizer == "muon" else adamw_rate)
    lr_other = args.lr_other if args.lr_other is not None else (muon_other if args.optimizer == "muon" else lr)
    n = args.lr_scale_gpus
    if n < 1:
        raise ValueError("--lr-scale-gpus must be >= 1")
    lr *= math.sqrt(n) if args.optimizer == "muon" else n
    lr_other *= n
    kw = {f.name: getattr(args, f.name) for f in fields(OptConfig)
          if f.name not in ("lr", "lr_other")}
    oc = OptConfig(lr=lr, lr_other=lr_other, **kw)
    oc.validate()
    return oc


# --paper-setup 1, --deconstructing-setup 1: the recipes presets/recipes/NAME.conf as defaults that
# explicit flags override (as train_san.cu apply_recipe). The trainer's flags this reference does
# not have are left out (REFERENCE_LACKS: --ns-fp32, --grad-fp32, fp32 here anyway; --milestones,
# it saves none; --indicator-context, it logs no indicators; --train-doc-draw and --train-doc-seed,
# it has no --train-doc-eval); resume-keeps is the trainer's (this reference does not resume runs).
RECIPE_OWN_KEYS = ("resume-keeps", "paper-max-steps", "paper-warmup-steps", "paper-run-steps")
REFERENCE_LACKS = ("ns-fp32", "grad-fp32", "milestones", "indicator-context", "train-doc-draw", "train-doc-seed")


def recipe_defaults(parser, recipe, steps, schedule_steps=0, preset=None):
    """{dest: value} of a recipe for the parser: its flags typed as the parser reads them, PRESET.flag
    for `preset` only, and the paper's schedule (paper-*-steps) scaled to `steps`: a horizon of
    steps x max / run (unless --schedule-steps is given) and steps x warmup / run warmup steps as a
    fraction of it (at most 1)."""
    actions = {a.option_strings[0][2:]: a for a in parser._actions if a.option_strings}
    out, own, for_preset = {}, {}, []
    for key, value, line in read_recipe(recipe):
        if key in RECIPE_OWN_KEYS:
            own[key] = value
        elif "." in key:
            name, flag = key.rsplit(".", 1)
            if name not in PRESETS:
                raise ValueError(f"presets/recipes/{recipe}.conf line {line}: {key} names no preset")
            if name == preset:
                for_preset.append((flag, value))
        elif key in actions:
            out[actions[key].dest] = actions[key].type(value) if actions[key].type else value
        elif key not in REFERENCE_LACKS:
            raise ValueError(f"presets/recipes/{recipe}.conf line {line}: unknown setting {key!r}")
    for flag, value in for_preset:
        out[actions[flag].dest] = actions[flag].type(value) if actions[flag].type else value
    if "paper-run-steps" in own:
        steps, run = max(1, steps), float(own["paper-run-steps"])
        horizon = schedule_steps if schedule_steps > 0 else max(1, round_steps(float(own["paper-max-steps"]) / run, steps))
        out.update(schedule_steps=horizon, warmup_frac=min(1.0, steps * float(own["paper-warmup-steps"]) / run / horizon))
    return out


def fixed_input_line(cfg):
    """The start-up line on the fixed QK input (as train_san.cu prints it): model state, not a parameter."""
    if cfg.attention == "rndembqk":
        what = f"eps ~ N(0, {fixed_input_std(cfg):g}^2) of {cfg.seq_len} x {cfg.n_embd}"
        n = cfg.seq_len * cfg.n_embd
    else:
        what = f"the embedding of {cfg.seq_len} fixed tokens"
        n = cfg.seq_len
    return (f"fixed QK input ({cfg.attention}): {what} = {n} values of model state (in checkpoints; not a parameter, "
            f"not counted above)")


def first_tokens(pattern, cfg):
    """fixedseqqk's fixed sequence: the first seq_len tokens of the training data (its shards in
    sorted order, as train_san.cu takes them), or None without --train-data (debug states: the
    model draws a row, attnref/san.py SAN.init_weights)."""
    if not pattern:
        return None
    files = sorted(f for f in glob.glob(pattern) if f.endswith(".bin"))
    if not files:
        raise ValueError(f"--train-data {pattern}: no token shards match (fixedseqqk takes its fixed tokens from them)")
    tokens = []
    for f in files:
        tokens += list(read_shard(f)[: cfg.seq_len - len(tokens)])
        if len(tokens) == cfg.seq_len:
            return tokens
    raise ValueError(f"--train-data {pattern}: {len(tokens)} tokens, fewer than the seq_len {cfg.seq_len} fixed tokens "
                     f"of fixedseqqk")


def paper_preset_warning(args):
    """The line train_san.cu prints when a SAN-paper preset trains keller-order Muon without
    either recipe: the preset's rates are the paper's locks, tuned for its paper-order Muon."""
    if (PRESET_FILES[args.preset].tuned_for != "paper-setup" or args.paper_setup or args.deconstructing_setup or not args.steps
            or args.optimizer != "muon" or args.muon_order != "keller"):
        return None
    return (f"warning: --preset {args.preset} without --paper-setup 1: keller-order Muon at the SAN paper's rates, "
            f"which are tuned for its paper-order Muon; --paper-setup 1 trains the paper's recipe")


def parse_args(argv=None):
    parser = build_parser()
    early, _ = parser.parse_known_args(argv)
    if early.paper_setup and early.deconstructing_setup:
        parser.error("--paper-setup 1 and --deconstructing-setup 1 are two recipes: give one")
    for recipe, on in (("paper-setup", early.paper_setup), ("deconstructing-setup", early.deconstructing_setup)):
        if on:
            parser.set_defaults(**recipe_defaults(parser, recipe, early.steps, early.schedule_steps, early.preset))
    args = parser.parse_args(argv)
    if args.global_batch:
        if args.global_batch % args.batch_size:
            parser.error(f"--global-batch {args.global_batch} is not a multiple of --batch-size {args.batch_size}")
        accum = args.global_batch // args.batch_size
        if args.grad_accum and args.grad_accum != accum:
            parser.error(f"--grad-accum {args.grad_accum} contradicts --global-batch {args.global_batch} / "
                         f"--batch-size {args.batch_size} = {accum} micro-batches")
        args.grad_accum = accum
    args.grad_accum = args.grad_accum or 1
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        device = training.resolve_device(args.device)
        tb = training.load_tokenizer_bin(args.tokenizer) if args.tokenizer else None
        step0, resume_tensors = 0, None
        if args.init_from and args.load_checkpoint:
            raise ValueError("--init-from and --load-checkpoint are exclusive")
        if args.load_checkpoint or args.init_from:
            given = [training.model_flag(f.name) for f in fields(SANConfig) if getattr(args, f.name) is not None]
            if given:
                raise ValueError(f"model config flags ({', '.join(given)}) cannot be combined with "
                                 f"--load-checkpoint or --init-from: the config comes from the checkpoint")
            source = args.load_checkpoint or args.init_from
            model, step0, ckpt_meta, ckpt_tensors = load_checkpoint(source, device)
            if args.init_from:  # the model only: the optimizer and the schedule start fresh
                step0 = 0
            elif ckpt_meta.get("has_optimizer") == "1":
                resume_tensors = ckpt_tensors
            cfg = model.cfg
            if tb is not None and tb["vocab_size"] != cfg.vocab_size:
                raise ValueError(f"--tokenizer {args.tokenizer} has a vocabulary of {tb['vocab_size']}; the model in "
                                 f"{source} has {cfg.vocab_size}")
        else:
            if tb is not None and args.vocab_size is None:  # the tokenizer sets the vocabulary (as train_san.cu)
                args.vocab_size = tb["vocab_size"]
            cfg = config_from_args(args)
            model = None
        oc = opt_from_args(args, cfg)
        T = training.row_length(args, cfg)
    except (ValueError, ContainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    training.print_model(cfg, count_parameters(cfg), flops_per_token(cfg))
    if cfg.attention in FIXED_QK_KINDS:
        print(fixed_input_line(cfg))
    warning = paper_preset_warning(args)
    if warning:
        print(warning)

    try:
        fixed = first_tokens(args.train_data, cfg) if model is None and cfg.attention == "fixedseqqk" else None
    except (ValueError, ContainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.write_debug_state:
        training.debug_state_from_args(args, SAN(cfg).init_weights(args.seed, fixed), oc, Optimizer)
        return 0

    if model is None:
        model = SAN(cfg).init_weights(args.seed, fixed).to(device)
    model.attn_impl = args.attn_impl
    if args.skip_nonstandard != "none":
        if args.steps or not (args.init_from or args.load_checkpoint):
            print("error: --skip-nonstandard evaluates a trained model: give --load-checkpoint CKPT without --steps",
                  file=sys.stderr)
            return 1
        model.skip = args.skip_nonstandard
    if args.attn_impl == "fast" and cfg.doc_mask and args.steps > 0 and str(device).startswith("cpu"):
        print("error: --attn-impl fast with the document mask trains only on a GPU (FlexAttention has no CPU "
              "backward); use --doc-mask 0 or another --attn-impl", file=sys.stderr)
        return 1
    try:
        training.train_and_validate(args, model, oc, Optimizer, step0, resume_tensors, T)
    except (ValueError, ContainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    training.print_sample(args, model, tb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
