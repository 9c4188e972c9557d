#!/usr/bin/python3
"""tests/tools/llama3_ref.py — an independent Llama forward pass in numpy,
outside the engine, for the golden tests of Llama 3 models (test_llama3.c,
tests/golden/llama3.sh).

It reads a Hugging Face folder itself: config.json, and model.safetensors
(an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}}, raw little-endian data; F32, F16 or BF16). The forward pass
is HF LlamaForCausalLM's: RMSNorm, q/k/v projections, RoPE on the
rotate_half layout (pairs (i, i + head_dim/2)) with the inverse
frequencies of HF's rope_scaling "llama3" (or none), grouped-query causal
attention, SwiGLU, final norm, lm_head (the embedding when tied). It
prefills the prompt, then greedy-decodes with a KV cache. Arithmetic is
float64 (--f32: float32).

  llama3_ref.py --model DIR (--ids FILE | --text STR) [--n 16] [--bos]
                [--logits OUT] [--no-scaling] [--f32]

--ids FILE: whitespace-separated prompt ids. --text STR (ASCII only): cut
by Llama 3's pre-tokenizer regex (\p{L} and \p{N} narrowed to ASCII), and
every piece must be one vocabulary token: Llama 3's tokenizer.json sets
ignore_merges, so such a piece encodes to that token; other text is
refused. --bos prepends <|begin_of_text|>.

Prints one JSON object: prompt (ids), generated (ids; stops after an
end-of-turn id of generation_config.json / <|eot_id|> / <|eom_id|> /
<|end_of_text|>, which is not included), text (the generated text as
llamad's streaming detokenizer gives it: bytes of the ids, each byte that
is not part of a valid UTF-8 character U+FFFD, control ids none), and the
top-2 margin of each greedy choice. --logits OUT: float32 logits, one row
per greedy choice (the row after the prompt, then after each generated id).
"""
import argparse
import json
import math
import os
import re
import struct
import sys

import numpy as np


def load_safetensors(path):
    with open(path, 'rb') as f:
        data = f.read()
    (hlen,) = struct.unpack('<Q', data[:8])
    hdr = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, e in hdr.items():
        if name == '__metadata__':
            continue
        b, en = e['data_offsets']
        raw = data[base + b:base + en]
        dt = e['dtype']
        if dt == 'F32':
            a = np.frombuffer(raw, dtype='<f4')
        elif dt == 'F16':
            a = np.frombuffer(raw, dtype='<f2').astype(np.float32)
        elif dt == 'BF16':
            u = np.frombuffer(raw, dtype='<u2').astype(np.uint32) << 16
            a = u.view(np.float32)
        else:
            sys.exit('llama3_ref: %s: tensor %s has dtype %s' % (path, name, dt))
        out[name] = a.reshape(e['shape'])
    return out


def load_weights(d):
    p = os.path.join(d, 'model.safetensors')
    if os.path.exists(p):
        return load_safetensors(p)
    idx = json.load(open(os.path.join(d, 'model.safetensors.index.json')))
    w = {}
    for f in sorted(set(idx['weight_map'].values())):
        w.update(load_safetensors(os.path.join(d, f)))
    return w


def inv_freq_hf(cfg, hd, scaling, dt):
    """HF's default inverse frequencies, then _compute_llama3_parameters."""
    theta = cfg.get('rope_theta', 10000.0)
    inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=dt) / dt(hd)))
    rs = cfg.get('rope_scaling')
    if not scaling or not rs:
        return inv.astype(dt)
    kind = rs.get('rope_type', rs.get('type'))
    if kind != 'llama3':
        sys.exit('llama3_ref: rope_scaling %r not implemented' % kind)
    factor = rs['factor']
    low = rs['low_freq_factor']
    high = rs['high_freq_factor']
    orig = rs['original_max_position_embeddings']
    low_wl = orig / low
    high_wl = orig / high
    wavelen = 2 * math.pi / inv
    inv_l = np.where(wavelen > low_wl, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return np.where(medium, smoothed, inv_l).astype(dt)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


class Model:
    def __init__(self, d, scaling, dt):
        self.cfg = cfg = json.load(open(os.path.join(d, 'config.json')))
        self.dt = dt
        w = load_weights(d)
        self.w = {k: v.astype(dt) for k, v in w.items()}
        self.dim = cfg['hidden_size']
        self.nh = cfg['num_attention_heads']
        self.nkv = cfg.get('num_key_value_heads', self.nh)
        self.hd = cfg.get('head_dim') or self.dim // self.nh
        self.nl = cfg['num_hidden_layers']
        self.eps = cfg.get('rms_norm_eps', 1e-6)
        self.inv = inv_freq_hf(cfg, self.hd, scaling, dt)
        self.cls = self.w.get('lm_head.weight')
        if self.cls is None:
            if not cfg.get('tie_word_embeddings'):
                sys.exit('llama3_ref: no lm_head.weight and not tied')
            self.cls = self.w['model.embed_tokens.weight']
        self.k = [np.zeros((0, self.nkv, self.hd), dt) for _ in range(self.nl)]
        self.v = [np.zeros((0, self.nkv, self.hd), dt) for _ in range(self.nl)]

    def rope(self, x, pos):
        f = pos[:, None].astype(self.dt) * self.inv[None, :]   # (T, hd/2)
        emb = np.concatenate([f, f], axis=-1)[:, None, :]      # (T, 1, hd)
        return x * np.cos(emb) + rotate_half(x) * np.sin(emb)

    def forward(self, ids):
        """Append ids (positions after the cached ones); logits of the last."""
        w, dt = self.w, self.dt
        T = len(ids)
        p0 = self.k[0].shape[0]
        pos = np.arange(p0, p0 + T)
        h = w['model.embed_tokens.weight'][np.array(ids)]       # (T, dim)
        g = self.nh // self.nkv
        for l in range(self.nl):
            pre = 'model.layers.%d.' % l
            x = rms_norm(h, w[pre + 'input_layernorm.weight'], self.eps)
            q = (x @ w[pre + 'self_attn.q_proj.weight'].T).reshape(T, self.nh, self.hd)
            k = (x @ w[pre + 'self_attn.k_proj.weight'].T).reshape(T, self.nkv, self.hd)
            v = (x @ w[pre + 'self_attn.v_proj.weight'].T).reshape(T, self.nkv, self.hd)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            self.k[l] = np.concatenate([self.k[l], k])
            self.v[l] = np.concatenate([self.v[l], v])
            K, V = self.k[l], self.v[l]                          # (S, nkv, hd)
            att = np.empty((T, self.nh, self.hd), dt)
            scale = dt(1.0 / math.sqrt(self.hd))
            for c0 in range(0, T, 512):                          # query chunks
                c1 = min(T, c0 + 512)
                qp = pos[c0:c1]
                n = p0 + c1                                      # keys seen
                mask = np.arange(n)[None, :] > qp[:, None]       # (t, n) causal
                for hh in range(self.nh):
                    kv = hh // g
                    s = (q[c0:c1, hh] @ K[:n, kv].T) * scale     # (t, n)
                    s = np.where(mask, -np.inf, s)
                    s = np.exp(s - s.max(axis=-1, keepdims=True))
                    s /= s.sum(axis=-1, keepdims=True)
                    att[c0:c1, hh] = s @ V[:n, kv]
            h = h + att.reshape(T, -1) @ w[pre + 'self_attn.o_proj.weight'].T
            x = rms_norm(h, w[pre + 'post_attention_layernorm.weight'], self.eps)
            gt = x @ w[pre + 'mlp.gate_proj.weight'].T
            up = x @ w[pre + 'mlp.up_proj.weight'].T
            h = h + (gt / (1 + np.exp(-gt)) * up) @ w[pre + 'mlp.down_proj.weight'].T
        x = rms_norm(h[-1], w['model.norm.weight'], self.eps)
        return x @ self.cls.T


# ---- the vocabulary ------------------------------------------------------------

def byte_alphabet():
    """ByteLevel: byte -> code point (printable ASCII/Latin-1 as themselves)."""
    keep = list(range(0x21, 0x7f)) + list(range(0xa1, 0xad)) + list(range(0xae, 0x100))
    m, n = {}, 0
    for b in range(256):
        if b in keep:
            m[b] = b
        else:
            m[b] = 0x100 + n
            n += 1
    return m


class Vocab:
    def __init__(self, d):
        tj = json.load(open(os.path.join(d, 'tokenizer.json')))
        self.piece = {}
        for s, i in tj['model']['vocab'].items():
            self.piece[i] = s
        self.control = set()
        for a in tj.get('added_tokens', []):
            self.piece[a['id']] = a['content']
            if a.get('special'):
                self.control.add(a['id'])
        self.id = {s: i for i, s in self.piece.items()}
        self.unbyte = {chr(c): b for b, c in byte_alphabet().items()}
        self.ends = set()
        for name in ('<|eot_id|>', '<|eom_id|>', '<|end_of_text|>'):
            if name in self.id:
                self.ends.add(self.id[name])
        gp = os.path.join(d, 'generation_config.json')
        if os.path.exists(gp):
            e = json.load(open(gp)).get('eos_token_id')
            self.ends.update(e if isinstance(e, list) else [e] if e is not None else [])
        self.bos = self.id.get('<|begin_of_text|>')

    # Llama 3's pre-tokenizer regex with \p{L} / \p{N} narrowed to ASCII
    WORDS = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|"
                       r"[0-9]{1,3}| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

    def encode_words(self, text):
        if not text.isascii():
            sys.exit('llama3_ref: --text must be ASCII; use --ids')
        alpha = byte_alphabet()
        out, at = [], 0
        for m in self.WORDS.finditer(text):
            if m.start() != at:
                sys.exit('llama3_ref: the word cut leaves a gap; use --ids')
            at = m.end()
            w = ''.join(chr(alpha[b]) for b in m.group(0).encode())
            if w not in self.id:
                sys.exit('llama3_ref: %r is not one vocabulary token; use --ids' % m.group(0))
            out.append(self.id[w])
        if at != len(text):
            sys.exit('llama3_ref: the word cut does not cover the text; use --ids')
        return out

    def bytes_of(self, i):
        if i in self.control:
            return None                                         # cuts a character
        return bytes(self.unbyte[c] for c in self.piece[i])


def utf8_len(b):
    if b < 0x80:
        return 1
    if 0xc2 <= b <= 0xdf:
        return 2
    if 0xe0 <= b <= 0xef:
        return 3
    if 0xf0 <= b <= 0xf4:
        return 4
    return 0


def detok(segments):
    """Valid characters as they are, every other byte U+FFFD; a control id
    (None) ends a segment, so a character cannot span it."""
    out = ''
    for seg in segments:
        i = 0
        while i < len(seg):
            n = utf8_len(seg[i])
            if n and i + n <= len(seg):
                try:
                    out += seg[i:i + n].decode('utf-8')
                    i += n
                    continue
                except UnicodeDecodeError:
                    pass
            out += '\ufffd'
            i += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', required=True)
    ap.add_argument('--ids')
    ap.add_argument('--text')
    ap.add_argument('--bos', action='store_true')
    ap.add_argument('--n', type=int, default=16)
    ap.add_argument('--logits')
    ap.add_argument('--no-scaling', action='store_true')
    ap.add_argument('--f32', action='store_true')
    a = ap.parse_args()
    dt = np.float32 if a.f32 else np.float64
    voc = Vocab(a.model)
    if a.ids:
        prompt = [int(x) for x in open(a.ids).read().split()]
    elif a.text is not None:
        prompt = voc.encode_words(a.text)
    else:
        sys.exit('llama3_ref: --ids or --text')
    if a.bos:
        prompt = [voc.bos] + prompt
    m = Model(a.model, not a.no_scaling, dt)
    rows, gen, margins = [], [], []
    logits = m.forward(prompt)
    for step in range(a.n):
        rows.append(logits.astype(np.float32))
        top = np.argsort(logits)[-2:]
        margins.append(float(logits[top[1]] - logits[top[0]]))
        nxt = int(top[1])
        if nxt in voc.ends:
            break
        gen.append(nxt)
        if step + 1 < a.n:
            logits = m.forward([nxt])
    if a.logits:
        np.concatenate(rows).astype('<f4').tofile(a.logits)
    segs, cur = [], b''
    for i in gen:
        b = voc.bytes_of(i)
        if b is None:
            segs.append(cur)
            cur = b''
        else:
            cur += b
    segs.append(cur)
    print(json.dumps({'prompt_len': len(prompt), 'generated': gen, 'text': detok(segs),
                      'margins': margins}, ensure_ascii=False))


if __name__ == '__main__':
    main()
