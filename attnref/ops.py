"""
Functional pieces both models use (explicit maths; shapes in the docstrings): the document
ids and the loss mask of a batch, the causal (and same-document) attention mask, grouped-
query attention written out (and through F.scaled_dot_product_attention, the cross-check;
and the fused speed path of fast_attention), and the language-model loss with its z-loss term.
"""

import math

import torch
import torch.nn.functional as F

def document_ids(idx, bos_id):
    """(B,T) int64: number of BOS tokens at positions <= t in the row. Tokens before the
    first BOS of a row get id 0 (the tail of a document begun in an earlier row)."""
    return torch.cumsum((idx == bos_id).to(torch.int64), dim=1)


def loss_mask(targets, cfg):
    """(B,T) bool: which targets enter the loss. A target < 0 is always ignored; with the
    document mask on, a target equal to BOS (the prediction that crosses into the next
    document) is ignored too."""
    m = targets >= 0
    if cfg.doc_mask:
        m = m & (targets != cfg.bos_id)
    return m


def attention_mask(T, doc_ids, device):
    """(B or 1, 1, 1, T, T) bool: True where query t may attend key s (s <= t, and the same
    document when doc_ids is given)."""
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    if doc_ids is None:
        return causal[None, None, None]
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (causal[None] & same)[:, None, None]


def gqa_attention(q, k, v, mask):
    """Explicit grouped-query causal attention.
    q (B,Hq,T,hd), k,v (B,Hkv,T,hd); query head h uses kv head h // (Hq/Hkv).
    mask from attention_mask. Returns (B,Hq,T,hd)."""
    B, Hq, T, hd = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    qg = q.view(B, Hkv, G, T, hd)
    scores = torch.einsum("bkgtd,bksd->bkgts", qg, k) / math.sqrt(hd)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bkgts,bksd->bkgtd", probs, v)
    return out.reshape(B, Hq, T, hd)


def sdpa_attention(q, k, v, mask):
    """Second path via F.scaled_dot_product_attention (cross-check only)."""
    G = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, :, 0])


def fast_attention_mask(T, doc_ids):
    """What fast_attention takes instead of attention_mask's dense (T, T) mask, which rules
    out the fused backends: None for the plain causal mask (SDPA's is_causal, which admits the
    flash backend), else a FlexAttention BlockMask of "causal and same document"."""
    if doc_ids is None:
        return None
    from torch.nn.attention.flex_attention import create_block_mask

    def causal_same_document(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    return create_block_mask(causal_same_document, doc_ids.shape[0], None, T, T, device=doc_ids.device)


def fast_attention(q, k, v, mask):
    """The speed path (q (B,Hq,T,hd), k,v (B,Hkv,T,hd), mask from fast_attention_mask):
    SDPA with is_causal (flash backend on a GPU) or FlexAttention with the document block
    mask; GQA without repeating k and v. Fused only under torch.compile (--compile 1)."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention(q, k, v, block_mask=mask, enable_gqa=True)


def san_loss(logits, targets, cfg):
    """Masked mean cross-entropy + z_loss * mean(lse^2), both over the unmasked positions,
    softmax over the real vocabulary only. Returns (loss, ce_mean, lse_sq_mean)."""
    logits = logits[..., : cfg.vocab_size]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    m = loss_mask(targets, cfg)
    n = m.sum().clamp(min=1).to(logits.dtype)                # all masked -> loss 0
    lse = torch.logsumexp(logits, dim=-1)                    # (B,T)
    tgt = torch.gather(logits, -1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    mf = m.to(logits.dtype)
    ce = ((lse - tgt) * mf).sum() / n
    lse_sq = (lse * lse * mf).sum() / n
    return ce + cfg.z_loss * lse_sq, ce, lse_sq


