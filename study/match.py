"""
match.py: the matched partners of one SAN-family arm (the SAN paper, "Question").

Given an arm (SAN or FFN; layers, width, heads, kv heads, vocabulary, d_ff, context), prints
its partners of the other kind:
  iso-depth  the same number of layers;
  iso-param  the depth whose non-embedding parameter count is closest to the arm's
             (ties: the shallower);
  iso-FLOP   the deepest arm whose training FLOPs per token do not exceed the arm's
             (the SAN paper's choice: the FFN partner gets at most the SAN's compute);
with their parameter counts, FLOPs per token, their mismatch against the arm and the train_san
flags that build them. --exact-depths N lists the depths whose iso-param partner is exact (within
1%), so that a study can choose a SAN depth whose iso-param gap needs no caveat.

Counts and FLOPs are closed forms written here from doc/san-model.md's parameter list, not
taken from the trainers (dev/test/test_study.py checks they equal train_san.cu's and
train_san.py's):
  per layer   attention  d*qd + 2*d*kvd + qd*d   (W_q, W_k, W_v, W_o; qd = Hq*hd, kvd = Hkv*hd)
                         + d (pre-norm) + 2*hd (QK-norm gains) + d (sandwich) + 1 (gate)
              FFN        3*d*d_ff (W_gate, W_up, W_down) + d (pre-norm) + d (sandwich) + 1 (gate)
  final norm  d;   embedding  Vp*d (tied; Vp = V padded to a multiple of 128)
  non-embedding = everything but the embedding
FLOP convention (the trainer's MFU, PaLM's): training FLOPs per token =
  6 * (non-embedding parameters + V*d for the LM head) + 12 * L * T * d
(forward + backward of every matmul, plus the T x T attention scores and values, no causal
halving).

    python -m study match --preset san20
    python -m study match --preset demo --n-embd 64 --vocab-size 2048 --exact-depths 16
    python -m study match --n-layer 12 --n-embd 128 --n-head 4 --n-kv-head 2 --vocab-size 8192 --max-seq-len 256
"""
import argparse
import dataclasses
import sys
from dataclasses import dataclass

from attnref.presets import load_presets

VOCAB_PAD = 128


@dataclass(frozen=True)
class Arm:
    """The model fields that decide parameter counts and FLOPs (train_san's flag names)."""
    ffn: str = "none"          # none (SAN) | swiglu (FFN arm)
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_kv_head: int = 2
    vocab_size: int = 250
    seq_len: int = 64          # the model's context T (--max-seq-len)
    d_ff: int = 0              # 0: 4 d
    qk_norm: int = 1
    residual: str = "gated"    # gated | standard | rezero | none
    sandwich: int = 0

    def resolved_d_ff(self):
        return self.d_ff if self.d_ff > 0 else 4 * self.n_embd

    def check(self):
        def need(ok, what):
            if not ok:
                raise ValueError(f"bad arm: {what}")
        need(self.ffn in ("none", "swiglu"), f"ffn must be none or swiglu, not {self.ffn!r}")
        need(min(self.n_layer, self.n_embd, self.n_head, self.n_kv_head, self.vocab_size, self.seq_len) > 0,
             "layers, width, heads, kv heads, vocabulary and context must be positive")
        need(self.n_embd % self.n_head == 0, f"--n-embd {self.n_embd} is not a multiple of --n-head {self.n_head}")
        need(self.n_head % self.n_kv_head == 0, f"--n-head {self.n_head} is not a multiple of --n-kv-head {self.n_kv_head}")
        need(self.residual in ("gated", "standard", "rezero", "none"), f"unknown residual {self.residual!r}")
        return self


# train_san's presets: presets/NAME.conf, the files train_san compiles in, read by attnref/presets.py
# (no torch); an Arm takes the fields that decide counts and FLOPs.


def arm_of_preset(preset):
    """The Arm of an attnref.presets.Preset, from its flags' text (--max-seq-len is seq_len)."""
    kw = {}
    for f in dataclasses.fields(Arm):
        text = preset.model["max-seq-len" if f.name == "seq_len" else f.name.replace("_", "-")]
        kw[f.name] = text if f.type is str else int(text)
    return Arm(**kw)


PRESETS = {name: arm_of_preset(p) for name, p in load_presets().items()}

# Arm fields <-> train_san flags
FLAG_OF_FIELD = {"ffn": "--ffn", "n_layer": "--n-layer", "n_embd": "--n-embd", "n_head": "--n-head",
                 "n_kv_head": "--n-kv-head", "vocab_size": "--vocab-size", "seq_len": "--max-seq-len",
                 "d_ff": "--d-ff", "qk_norm": "--qk-norm", "residual": "--residual", "sandwich": "--sandwich"}


def padded_vocab(arm):
    return -(-arm.vocab_size // VOCAB_PAD) * VOCAB_PAD


def layer_parameters(arm):
    """(attention block, FFN block) parameters of one layer; the FFN block is 0 for a SAN."""
    d, hd = arm.n_embd, arm.n_embd // arm.n_head
    qd, kvd = arm.n_head * hd, arm.n_kv_head * hd
    gate = 1 if arm.residual in ("gated", "rezero") else 0
    attention = d * qd + 2 * d * kvd + qd * d + d + (2 * hd if arm.qk_norm else 0) + (d if arm.sandwich else 0) + gate
    ffn = 0
    if arm.ffn == "swiglu":
        ffn = 3 * d * arm.resolved_d_ff() + d + (d if arm.sandwich else 0) + gate
    return attention, ffn


def parameter_counts(arm):
    """(total, non-embedding); total includes the padded embedding rows, as the trainers count."""
    attention, ffn = layer_parameters(arm)
    nonemb = arm.n_layer * (attention + ffn) + arm.n_embd
    return nonemb + padded_vocab(arm) * arm.n_embd, nonemb


def flops_per_token(arm):
    """Training FLOPs per token (see the module docstring for the convention)."""
    nonemb = parameter_counts(arm)[1]
    return 6 * (nonemb + arm.vocab_size * arm.n_embd) + 12 * arm.n_layer * arm.seq_len * arm.n_embd


def partner_kind(arm):
    return "swiglu" if arm.ffn == "none" else "none"


def partners(arm, max_layers=None):
    """{"iso-depth": Arm, "iso-param": Arm, "iso-FLOP": Arm or None} of the other kind."""
    arm.check()
    other = dataclasses.replace(arm, ffn=partner_kind(arm))
    # depths to consider: enough that both the count and the FLOPs of the partner pass the arm's
    limit = max_layers or max(4 * arm.n_layer, 8) * 8
    at = {n: dataclasses.replace(other, n_layer=n) for n in range(1, limit + 1)}
    target_params = parameter_counts(arm)[1]
    iso_param = min(at.values(), key=lambda a: (abs(parameter_counts(a)[1] - target_params), a.n_layer))
    budget = flops_per_token(arm)
    affordable = [a for a in at.values() if flops_per_token(a) <= budget]
    iso_flop = max(affordable, key=lambda a: a.n_layer) if affordable else None
    return {"iso-depth": at[arm.n_layer], "iso-param": iso_param, "iso-FLOP": iso_flop}


def preset_name(arm):
    """The train_san preset that is exactly this arm, or None."""
    for name, p in PRESETS.items():
        if p == arm or dataclasses.replace(p, d_ff=p.resolved_d_ff()) == dataclasses.replace(arm, d_ff=arm.resolved_d_ff()):
            return name
    return None


def train_san_flags(arm, base_preset=None):
    """train_san flags that build `arm`: its preset alone when one matches, else the flags that
    differ from base_preset (or from the tiny defaults)."""
    name = preset_name(arm)
    if name is not None:
        return ["--preset", name]
    base = PRESETS[base_preset] if base_preset else Arm()
    flags = ["--preset", base_preset] if base_preset else []
    for field, flag in FLAG_OF_FIELD.items():
        value = getattr(arm, field)
        if field == "d_ff":
            # the trainer keeps the base's d_ff when it has one, else resolves 0 to 4 d
            trainer_d_ff = base.d_ff if base.d_ff > 0 else 4 * arm.n_embd
            if arm.ffn == "swiglu" and arm.resolved_d_ff() != trainer_d_ff:
                flags += [flag, str(arm.resolved_d_ff())]
            continue
        if value != getattr(base, field):
            flags += [flag, str(value)]
    return flags


def describe(arm):
    kind = "SAN" if arm.ffn == "none" else f"FFN (d_ff {arm.resolved_d_ff()})"
    return f"{kind} L={arm.n_layer} d={arm.n_embd} heads {arm.n_head}/{arm.n_kv_head} V={arm.vocab_size} T={arm.seq_len}"


def mismatch(partner, arm):
    """(non-embedding parameters, relative; FLOPs per token, relative) of partner against arm."""
    params, target = parameter_counts(partner)[1], parameter_counts(arm)[1]
    return params - target, params / target - 1, flops_per_token(partner) / flops_per_token(arm) - 1


def mismatch_line(partner, arm):
    dparams, rel_params, rel_flops = mismatch(partner, arm)
    return (f"  against the arm: non-embedding parameters {dparams:+,} ({100 * rel_params:+.1f}%), "
            f"FLOPs per token {100 * rel_flops:+.1f}%")


EXACT = 0.01  # an iso-param partner within 1% of the arm's non-embedding parameters is called exact


def exact_depths(arm, up_to):
    """[(depth, iso-param partner, relative mismatch, exact?)] for the arm at depths 1..up_to: the
    depths at which the iso-param comparison needs no caveat (e.g. SAN 10 vs FFN 2 at d_ff 4d)."""
    rows = []
    for n in range(1, up_to + 1):
        at = dataclasses.replace(arm, n_layer=n)
        partner = partners(at)["iso-param"]
        rel = mismatch(partner, at)[1]
        rows.append((n, partner, rel, abs(rel) <= EXACT))
    return rows


def exact_depths_report(arm, up_to):
    lines = [f"iso-param partners of {describe(arm).replace(f'L={arm.n_layer} ', '')} at depths 1..{up_to}"
             f" (exact: within {100 * EXACT:.0f}% of the arm's non-embedding parameters)"]
    for n, partner, rel, exact in exact_depths(arm, up_to):
        lines.append(f"  L={n:<3d} -> {partner.n_layer:3d} layers  {100 * rel:+6.1f}%" + ("  exact" if exact else ""))
    return "\n".join(lines)


def report(arm, base_preset=None):
    """The text match.py prints."""
    total, nonemb = parameter_counts(arm)
    lines = [f"arm: {describe(arm)}",
             f"  {total:,} parameters, {nonemb:,} non-embedding; {flops_per_token(arm) / 1e9:.4f} GFLOPs/token",
             f"  flags: {' '.join(train_san_flags(arm, base_preset))}",
             "FLOPs per token = 6 x (non-embedding parameters + V x d) + 12 x L x T x d (the trainer's MFU convention)",
             ""]
    for name, p in partners(arm).items():
        if p is None:
            lines.append(f"{name}: none (even one layer of the other kind costs more FLOPs per token)")
            continue
        total, nonemb = parameter_counts(p)
        label = preset_name(p)
        lines += [f"{name}: {describe(p)}" + (f"  [preset {label}]" if label else ""),
                  f"  {total:,} parameters, {nonemb:,} non-embedding; {flops_per_token(p) / 1e9:.4f} GFLOPs/token",
                  mismatch_line(p, arm),
                  f"  flags: {' '.join(train_san_flags(p, base_preset))}"]
    return "\n".join(lines)


def arm_from_args(args):
    arm = PRESETS[args.preset] if args.preset else Arm()
    changes = {field: getattr(args, field) for field in FLAG_OF_FIELD if getattr(args, field) is not None}
    return dataclasses.replace(arm, **changes).check()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="start from a train_san preset (default: tiny's fields)")
    ap.add_argument("--ffn", choices=["none", "swiglu"])
    for field, flag in FLAG_OF_FIELD.items():
        if field not in ("ffn", "residual"):
            ap.add_argument(flag, dest=field, type=int, metavar="N", help=f"as train_san's {flag}")
    ap.add_argument("--residual", choices=["gated", "standard", "rezero", "none"])
    ap.add_argument("--exact-depths", type=int, metavar="N",
                    help="list the iso-param partner and its mismatch at every depth 1..N, marking the exact ones")
    args = ap.parse_args(argv)
    try:
        arm = arm_from_args(args)
    except ValueError as e:
        sys.exit(f"match.py: {e}")
    if args.exact_depths is not None:
        if args.exact_depths < 1:
            sys.exit("match.py: --exact-depths needs a depth of at least 1")
        print(exact_depths_report(arm, args.exact_depths))
        return
    print(report(arm, args.preset))


if __name__ == "__main__":
    main()
