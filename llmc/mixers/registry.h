/*
The token mixers by kind (llmc/mixers/attention_kinds.h names them; --attention picks one): one line
each. Adding a kind (doc/deconstructing.md "Adding an attention kind"): its header in this
folder (a TokenMixer, mixer.h; most derive from AttentionMixer, standard.h, and override the
step they change), its name in llmc/mixers/attention_kinds.h, and its line below.
*/
#pragma once

#include <memory>

#include "llmc/mixers/attention_kinds.h"  // defines: AttnKind, kAttnKinds
#include "approximate.h"
#include "fixed_qk.h"
#include "mixer.h"
#include "mlp.h"
#include "nonapprox.h"
#include "standard.h"
#include "static_emb_qk.h"

inline std::unique_ptr<TokenMixer> make_token_mixer(AttnKind kind, const MixerDims& dims) {
    switch (kind) {
        case AttnKind::Standard: return std::make_unique<AttentionMixer>(dims);
        case AttnKind::Mlp: return std::make_unique<MlpMixer>(dims);
        case AttnKind::Approximate: return std::make_unique<ApproximateMixer>(dims);
        case AttnKind::Nonapprox: return std::make_unique<NonapproxMixer>(dims);
        case AttnKind::RndEmbQK: return std::make_unique<FixedQKMixer>(dims, /*random=*/true);
        case AttnKind::FixedSeqQK: return std::make_unique<FixedQKMixer>(dims, /*random=*/false);
        case AttnKind::StaticEmbQK: return std::make_unique<StaticEmbQKMixer>(dims);
    }
    fatal("make_token_mixer: unknown attention kind %d", (int)kind);
}
