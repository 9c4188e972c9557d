/*
 * text/tok_bpe.c — byte-level BPE (GPT-2 style, as Llama 3 uses it).
 *
 * Encoding: the pre-tokenizer regex (PCRE2, UTF + UCP, JIT where the
 * library has it) cuts the text into words, each match and each gap between
 * matches one word; a word whose bytes are a vocabulary token is that token
 * (tokenizer.json's ignore_merges, set for Llama 3), otherwise its bytes
 * start as the 256 one-byte tokens and the adjacent pair of lowest merge rank
 * is merged, leftmost first on a tie, until no pair has a merge (a heap of
 * candidate pairs, so a long word costs n log n). Special tokens are never
 * recognised in text.
 *
 * Tokens are kept as the vocabulary's strings (the ByteLevel alphabet: each
 * byte is one code point, printable ASCII and Latin-1 as themselves, the
 * other 68 bytes as U+0100..U+0143) and as the bytes they stand for, which
 * is what encoding looks up and decoding emits. Control tokens stand for no
 * bytes; user-defined added tokens for their text as written.
 *
 * Loading checks everything it relies on and refuses with the file and the
 * reason: ids dense from 0 and each used once, every token a ByteLevel
 * string, all 256 bytes present as tokens, merges naming known tokens whose
 * concatenation is a token, a pre-tokenizer llamad knows.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "text/tok_int.h"
#include "text/tokenizer.h"
#include "util/cause.h"
#include "util/grow.h"
#include "util/utf8.h"

#define BPE_MAX_VOCAB (1 << 22)
#define BPE_MAX_MERGES (1 << 23)
#define BPE_MAX_END 8

/* Oniguruma's \s (what the Rust tokenizers crate compiles these regexes
 * with): Unicode White_Space. PCRE2's \s under UCP also takes U+180E
 * MONGOLIAN VOWEL SEPARATOR (a format character since Unicode 6.3), so the
 * patterns PCRE2 runs spell \s and \S with this class instead. */
#define WS "\\t\\n\\x0b\\f\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}" \
	   "\\x{202f}\\x{205f}\\x{3000}"

/* The pre-tokenizers llamad knows, by their GGUF names (tokenizer.ggml.pre):
 * the regex as tokenizer.json writes it, and as PCRE2 runs it. */
static const struct pre_kind {
	const char *name;
	const char *regex;
	const char *pcre;
	int ignore_merges;
} k_pre[] = {
	{ "llama-bpe",
	  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
	  " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
	  " ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+",
	  1 },
	{ "gpt2",
	  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
	  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS
	  "])|[" WS "]+",
	  0 },
};
#undef WS

/* A string in the arena: offset and length. */
struct span {
	uint32_t off, len;
};

/* Open-addressed table of ids, keyed by a span the caller resolves. */
struct idtab {
	int32_t *slot;   /* -1 empty */
	uint32_t mask;
};

struct pair {
	uint64_t key;    /* left << 32 | right; UINT64_MAX empty */
	int32_t rank, id;
};

struct bpe {
	int n_vocab;
	char *arena;
	size_t arena_len, arena_cap;
	struct span *piece;     /* (n_vocab) vocabulary string, NUL-terminated in the arena */
	struct span *bytes;     /* (n_vocab) bytes it stands for */
	uint8_t *type;          /* (n_vocab) enum tok_type */
	struct idtab by_piece, by_bytes;
	struct pair *pairs;
	uint32_t pair_mask;
	int n_merges;
	struct span *merge;     /* (n_merges) "left right" */
	int32_t byte_id[256];
	const struct pre_kind *pre;
	int ignore_merges;
	pcre2_code *re;
	int bos, eos;
	int32_t end[BPE_MAX_END];
	int n_end;
	/* load-time only */
	const char *what;
	char **cause;
};

static void fail(struct bpe *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct bpe *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	tok_vfail(b->cause, b->what, fmt, ap);
	va_end(ap);
}

/* ---- arena and tables ------------------------------------------------------ */

static int arena_add(struct bpe *b, const void *p, size_t n, struct span *sp)
{
	if (n > UINT32_MAX / 2 || b->arena_len + n + 1 > UINT32_MAX)
		return -E2BIG;
	if (grow(&b->arena, &b->arena_cap, b->arena_len + n + 1, 1, 1 << 16))
		return -ENOMEM;
	memcpy(b->arena + b->arena_len, p, n);
	b->arena[b->arena_len + n] = 0;
	sp->off = (uint32_t)b->arena_len;
	sp->len = (uint32_t)n;
	b->arena_len += n + 1;
	return 0;
}

static const char *at(const struct bpe *b, struct span s)
{
	return b->arena + s.off;
}

static int tab_init(struct idtab *t, size_t n)
{
	size_t sz = 16;
	while (sz < 2 * n)
		sz *= 2;
	t->slot = malloc(sz * sizeof(*t->slot));
	if (!t->slot)
		return -ENOMEM;
	memset(t->slot, 0xff, sz * sizeof(*t->slot));
	t->mask = (uint32_t)(sz - 1);
	return 0;
}

/* Id whose span (in spans) equals s[0..n), or -1. */
static int tab_find(const struct bpe *b, const struct idtab *t, const struct span *spans,
		    const void *s, size_t n)
{
	uint32_t h = (uint32_t)XXH3_64bits(s, n) & t->mask;
	for (;;) {
		int32_t id = t->slot[h];
		if (id < 0)
			return -1;
		if (spans[id].len == n && memcmp(at(b, spans[id]), s, n) == 0)
			return id;
		h = (h + 1) & t->mask;
	}
}

/* Insert id under its span unless an equal key is there; returns the id
 * already holding the key, or -1 if id was inserted. */
static int tab_put(const struct bpe *b, struct idtab *t, const struct span *spans, int id)
{
	const char *s = at(b, spans[id]);
	size_t n = spans[id].len;
	uint32_t h = (uint32_t)XXH3_64bits(s, n) & t->mask;
	for (;;) {
		int32_t o = t->slot[h];
		if (o < 0) {
			t->slot[h] = id;
			return -1;
		}
		if (spans[o].len == n && memcmp(at(b, spans[o]), s, n) == 0)
			return o;
		h = (h + 1) & t->mask;
	}
}

static uint32_t pair_hash(uint64_t k)
{
	k ^= k >> 29;
	k *= 0xbf58476d1ce4e5b9ull;
	k ^= k >> 32;
	return (uint32_t)k;
}

static const struct pair *pair_find(const struct bpe *b, int32_t l, int32_t r)
{
	uint64_t k = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
	uint32_t h = pair_hash(k) & b->pair_mask;
	for (;;) {
		const struct pair *p = &b->pairs[h];
		if (p->key == k)
			return p;
		if (p->key == UINT64_MAX)
			return NULL;
		h = (h + 1) & b->pair_mask;
	}
}

/* ---- ByteLevel alphabet ------------------------------------------------------ */

/* Code point that stands for byte v (GPT-2's bytes_to_unicode). */
static unsigned byte_cp(unsigned v)
{
	if ((v >= 0x21 && v <= 0x7e) || (v >= 0xa1 && v <= 0xac) || (v >= 0xae && v <= 0xff))
		return v;
	unsigned k = 0;
	for (unsigned u = 0; u < v; u++)
		if (!((u >= 0x21 && u <= 0x7e) || (u >= 0xa1 && u <= 0xac) || (u >= 0xae && u <= 0xff)))
			k++;
	return 0x100 + k;
}

/* Decode a ByteLevel string into out (at most n bytes: each code point is
 * one byte). Returns the byte count, or -1 if s is not such a string. */
static int unbyte(const int16_t *cp_byte, const char *s, size_t n, uint8_t *out)
{
	size_t i = 0;
	int o = 0;
	while (i < n) {
		unsigned c = (unsigned char)s[i], cp;
		if (c < 0x80) {
			cp = c;
			i++;
		} else if ((c & 0xe0) == 0xc0 && i + 1 < n && ((unsigned char)s[i + 1] & 0xc0) == 0x80) {
			cp = (c & 0x1f) << 6 | ((unsigned char)s[i + 1] & 0x3f);
			i += 2;
		} else {
			return -1;
		}
		if (cp >= 0x144 || cp_byte[cp] < 0)
			return -1;
		out[o++] = (uint8_t)cp_byte[cp];
	}
	return o;
}

/* ---- building ----------------------------------------------------------------- */

/* One vocabulary entry as the loaders see it. */
struct entry {
	const char *s;
	size_t n;
	int type;
};

/* Fill pieces, bytes and the lookup tables from ents[0..n). */
static int build_vocab(struct bpe *b, const struct entry *ents, int n)
{
	char sb[200];
	int16_t cp_byte[0x144];
	memset(cp_byte, 0xff, sizeof cp_byte);
	for (unsigned v = 0; v < 256; v++)
		cp_byte[byte_cp(v)] = (int16_t)v;

	b->n_vocab = n;
	b->piece = calloc((size_t)n, sizeof(*b->piece));
	b->bytes = calloc((size_t)n, sizeof(*b->bytes));
	b->type = calloc((size_t)n, 1);
	uint8_t *tmp = NULL;
	size_t tmp_cap = 0;
	if (!b->piece || !b->bytes || !b->type || tab_init(&b->by_piece, (size_t)n) ||
	    tab_init(&b->by_bytes, (size_t)n))
		goto oom;
	for (int i = 0; i < 256; i++)
		b->byte_id[i] = -1;
	for (int id = 0; id < n; id++) {
		const struct entry *e = &ents[id];
		if (!e->s) {
			fail(b, "id %d has no token (ids must run from 0 to %d)", id, n - 1);
			goto bad;
		}
		if (memchr(e->s, 0, e->n) || e->n == 0) {
			fail(b, "token %d is %s", id, e->n ? "a string with a NUL byte" : "empty");
			goto bad;
		}
		if (arena_add(b, e->s, e->n, &b->piece[id]))
			goto oom;
		b->type[id] = (uint8_t)e->type;
	}
	for (int id = 0; id < n; id++) {
		int o = tab_put(b, &b->by_piece, b->piece, id);
		if (o >= 0) {
			fail(b, "token \"%s\" appears twice (ids %d and %d)",
			     tok_shown(at(b, b->piece[id]), b->piece[id].len, sb), o, id);
			goto bad;
		}
		size_t len = b->piece[id].len;
		if (len > tmp_cap) {
			free(tmp);
			tmp_cap = len * 2;
			if (!(tmp = malloc(tmp_cap)))
				goto oom;
		}
		int k = 0;
		int ty = b->type[id];
		if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_UNUSED) {
			k = 0;
		} else if (ty == TOK_TYPE_USER_DEFINED) {
			memcpy(tmp, at(b, b->piece[id]), len);
			k = (int)len;
		} else {
			k = unbyte(cp_byte, at(b, b->piece[id]), len, tmp);
			if (k < 0) {
				fail(b, "token %d \"%s\" is not a byte-level BPE string", id,
				     tok_shown(at(b, b->piece[id]), len, sb));
				goto bad;
			}
		}
		if (arena_add(b, tmp, (size_t)k, &b->bytes[id]))
			goto oom;
	}
	/* by_bytes: encodable tokens only; the first of equal byte strings wins */
	for (int id = 0; id < n; id++) {
		if (b->bytes[id].len == 0 || b->type[id] != TOK_TYPE_NORMAL)
			continue;
		tab_put(b, &b->by_bytes, b->bytes, id);
		if (b->bytes[id].len == 1 && b->byte_id[(uint8_t)at(b, b->bytes[id])[0]] < 0)
			b->byte_id[(uint8_t)at(b, b->bytes[id])[0]] = id;
	}
	for (int v = 0; v < 256; v++) {
		if (b->byte_id[v] < 0) {
			fail(b, "byte 0x%02x has no token (a byte-level BPE vocabulary has all 256)",
			     v);
			goto bad;
		}
	}
	free(tmp);
	return 0;
oom:
	free(tmp);
	fail(b, "out of memory");
	return -ENOMEM;
bad:
	free(tmp);
	return -EINVAL;
}

/* Add merge number rank, "left right" given as its two halves. */
static int add_merge(struct bpe *b, int rank, const char *l, size_t ln, const char *r, size_t rn)
{
	char s1[200], s2[200];
	int li = tab_find(b, &b->by_piece, b->piece, l, ln);
	int ri = tab_find(b, &b->by_piece, b->piece, r, rn);
	if (li < 0 || ri < 0) {
		fail(b, "merge %d \"%s %s\" names an unknown token \"%s\"", rank, tok_shown(l, ln, s1),
		     tok_shown(r, rn, s2), li < 0 ? s1 : s2);
		return -EINVAL;
	}
	char stack[256];
	char *cat = ln + rn + 1 <= sizeof stack ? stack : malloc(ln + rn + 1);
	if (!cat) {
		fail(b, "out of memory");
		return -ENOMEM;
	}
	memcpy(cat, l, ln);
	memcpy(cat + ln, r, rn);
	int mi = tab_find(b, &b->by_piece, b->piece, cat, ln + rn);
	cat[ln] = ' ';
	memcpy(cat + ln + 1, r, rn);
	int rc = arena_add(b, cat, ln + rn + 1, &b->merge[rank]);
	if (cat != stack)
		free(cat);
	if (rc) {
		fail(b, "out of memory");
		return -ENOMEM;
	}
	if (mi < 0) {
		fail(b, "merge %d \"%s %s\" makes a token the vocabulary lacks", rank,
		     tok_shown(l, ln, s1), tok_shown(r, rn, s2));
		return -EINVAL;
	}
	/* merges work in the model's vocabulary: an added or control token
	 * there would come out of plain text and decode to other bytes */
	if (b->type[li] != TOK_TYPE_NORMAL || b->type[ri] != TOK_TYPE_NORMAL ||
	    b->type[mi] != TOK_TYPE_NORMAL) {
		int which = b->type[li] != TOK_TYPE_NORMAL ? li : b->type[ri] != TOK_TYPE_NORMAL ? ri : mi;
		fail(b, "merge %d \"%s %s\" %s token %d, which is not a vocabulary token "
		     "(an added or special one)", rank, tok_shown(l, ln, s1), tok_shown(r, rn, s2),
		     which == mi ? "makes" : "names", which);
		return -EINVAL;
	}
	uint64_t k = (uint64_t)(uint32_t)li << 32 | (uint32_t)ri;
	uint32_t h = pair_hash(k) & b->pair_mask;
	while (b->pairs[h].key != UINT64_MAX && b->pairs[h].key != k)
		h = (h + 1) & b->pair_mask;
	if (b->pairs[h].key == UINT64_MAX) {  /* a repeated merge keeps its first rank */
		b->pairs[h].key = k;
		b->pairs[h].rank = rank;
		b->pairs[h].id = mi;
	}
	return 0;
}

static int merges_init(struct bpe *b, size_t n)
{
	if (n > BPE_MAX_MERGES) {
		fail(b, "%zu merges is more than llamad accepts (%d)", n, BPE_MAX_MERGES);
		return -EINVAL;
	}
	size_t sz = 16;
	while (sz < 2 * n)
		sz *= 2;
	b->pairs = malloc(sz * sizeof(*b->pairs));
	b->merge = calloc(n ? n : 1, sizeof(*b->merge));
	if (!b->pairs || !b->merge) {
		fail(b, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < sz; i++)
		b->pairs[i].key = UINT64_MAX;
	b->pair_mask = (uint32_t)(sz - 1);
	b->n_merges = (int)n;
	return 0;
}

/* Split a GGUF-style "left right" merge at its first space after byte 0. */
static int add_merge_str(struct bpe *b, int rank, const char *s, size_t n)
{
	const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
	if (!sp) {
		char sb[200];
		fail(b, "merge %d \"%s\" is not two tokens separated by a space", rank,
		     tok_shown(s, n, sb));
		return -EINVAL;
	}
	return add_merge(b, rank, s, (size_t)(sp - s), sp + 1, n - (size_t)(sp - s) - 1);
}

const char *bpe_pre_of_regex(const char *regex)
{
	for (size_t i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
		if (!strcmp(regex, k_pre[i].regex))
			return k_pre[i].name;
	return NULL;
}

static int set_pre(struct bpe *b, const struct pre_kind *pk)
{
	int err;
	PCRE2_SIZE off;
	b->pre = pk;
	b->ignore_merges = pk->ignore_merges;
	b->re = pcre2_compile((PCRE2_SPTR)pk->pcre, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
			      &err, &off, NULL);
	if (!b->re) {
		PCRE2_UCHAR msg[160];
		pcre2_get_error_message(err, msg, sizeof msg);
		fail(b, "pre-tokenizer regex does not compile: %s", (char *)msg);
		return -EINVAL;
	}
	pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE);  /* the interpreter serves if JIT is absent */
	return 0;
}

/* End-of-turn ids by name, and BOS/EOS by name when no file said. */
static void add_end(struct bpe *b, int id)
{
	if (id < 0 || id >= b->n_vocab || b->type[id] != TOK_TYPE_CONTROL)
		return;
	for (int i = 0; i < b->n_end; i++)
		if (b->end[i] == id)
			return;
	if (b->n_end < BPE_MAX_END)
		b->end[b->n_end++] = id;
}

static int control_named(const struct bpe *b, const char *name)
{
	int id = tab_find(b, &b->by_piece, b->piece, name, strlen(name));
	return id >= 0 && b->type[id] == TOK_TYPE_CONTROL ? id : -1;
}

static void finish_specials(struct bpe *b)
{
	if (b->bos < 0)
		b->bos = control_named(b, "<|begin_of_text|>");
	if (b->eos < 0)
		b->eos = control_named(b, "<|end_of_text|>");
	static const char *const ends[] = { "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>" };
	for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
		add_end(b, control_named(b, ends[i]));
}

static void bpe_free(void *k)
{
	struct bpe *b = k;
	if (!b)
		return;
	free(b->arena);
	free(b->piece);
	free(b->bytes);
	free(b->type);
	free(b->by_piece.slot);
	free(b->by_bytes.slot);
	free(b->pairs);
	free(b->merge);
	pcre2_code_free(b->re);
	free(b);
}

static struct bpe *bpe_new(const char *what, char **cause)
{
	struct bpe *b = calloc(1, sizeof(*b));
	if (!b) {
		cause_set(cause, "tokenizer %s: out of memory", what);
		return NULL;
	}
	b->what = what;
	b->cause = cause;
	b->bos = b->eos = -1;
	return b;
}

static struct bpe *done(struct bpe *b, int rc)
{
	if (rc) {
		if (b->cause && !*b->cause)
			fail(b, "cannot load (error %d)", rc);
		bpe_free(b);
		return NULL;
	}
	b->what = NULL;
	b->cause = NULL;
	return b;
}

void *bpe_load_spec(const struct tok_bpe_spec *s, const char *what, char **cause)
{
	struct bpe *b = bpe_new(what, cause);
	if (!b)
		return NULL;
	int rc = -EINVAL;
	struct entry *ents = NULL;
	const struct pre_kind *pk = NULL;
	const char *pre = s->pre ? s->pre : "gpt2";
	for (size_t i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
		if (!strcmp(pre, k_pre[i].name))
			pk = &k_pre[i];
	if (!pk) {
		char sb[200];
		fail(b, "pre-tokenizer \"%s\" is not supported (llama-bpe and gpt2 are)",
		     tok_shown(pre, strlen(pre), sb));
		goto out;
	}
	if (s->n_vocab < 256 || s->n_vocab > BPE_MAX_VOCAB) {
		fail(b, "vocabulary of %d tokens is out of range (256..%d)", s->n_vocab,
		     BPE_MAX_VOCAB);
		goto out;
	}
	if (!(ents = calloc((size_t)s->n_vocab, sizeof(*ents)))) {
		rc = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < s->n_vocab; i++) {
		int ty = s->types ? s->types[i] : TOK_TYPE_NORMAL;
		if (ty == 0)
			ty = TOK_TYPE_NORMAL;
		if (ty < TOK_TYPE_NORMAL || ty > TOK_TYPE_BYTE) {
			fail(b, "token %d has unknown token type %d", i, ty);
			goto out;
		}
		ents[i] = (struct entry){ s->tokens[i], s->token_len[i],
					  ty == TOK_TYPE_BYTE ? TOK_TYPE_NORMAL : ty };
	}
	if ((rc = build_vocab(b, ents, s->n_vocab)) || (rc = merges_init(b, (size_t)s->n_merges)))
		goto out;
	for (int i = 0; i < s->n_merges; i++) {
		size_t l = s->merge_left ? s->merge_left[i] : TOK_MERGE_SPLIT, n = s->merge_len[i];
		rc = l == TOK_MERGE_SPLIT ? add_merge_str(b, i, s->merges[i], n)
					  : add_merge(b, i, s->merges[i], l, s->merges[i] + l + 1,
						      n - l - 1);
		if (rc)
			goto out;
	}
	if ((rc = set_pre(b, pk)))
		goto out;
	if (s->ignore_merges)
		b->ignore_merges = s->ignore_merges > 0;
	b->bos = s->bos >= 0 && s->bos < s->n_vocab ? s->bos : -1;
	b->eos = s->eos >= 0 && s->eos < s->n_vocab ? s->eos : -1;
	for (int i = 0; i < s->n_eot; i++)
		add_end(b, s->eot[i]);
	finish_specials(b);
out:
	free(ents);
	return done(b, rc);
}

/* ---- encoding ----------------------------------------------------------------- */

struct sym {
	int32_t id;
	int32_t prev, next;
};

struct cand {
	int32_t rank, left, right;
	int32_t lid, rid, id;
};

static int cand_less(const struct cand *a, const struct cand *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

struct work {
	int32_t *out;
	size_t n, cap;
	struct sym *sym;
	struct cand *heap;
	size_t sym_cap, heap_cap, n_heap;
};

static int emit(struct work *w, int32_t id)
{
	if (w->n == w->cap) {
		size_t c = w->cap ? w->cap * 2 : 256;
		if (c > INT_MAX)
			return -EOVERFLOW;
		int32_t *o = realloc(w->out, c * sizeof(*o));
		if (!o)
			return -ENOMEM;
		w->out = o;
		w->cap = c;
	}
	w->out[w->n++] = id;
	return 0;
}

static void heap_push(struct work *w, const struct cand *c)
{
	size_t i = w->n_heap++;
	w->heap[i] = *c;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!cand_less(&w->heap[i], &w->heap[p]))
			break;
		struct cand t = w->heap[i];
		w->heap[i] = w->heap[p];
		w->heap[p] = t;
		i = p;
	}
}

static struct cand heap_pop(struct work *w)
{
	struct cand top = w->heap[0];
	w->heap[0] = w->heap[--w->n_heap];
	size_t i = 0;
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < w->n_heap && cand_less(&w->heap[l], &w->heap[m]))
			m = l;
		if (r < w->n_heap && cand_less(&w->heap[r], &w->heap[m]))
			m = r;
		if (m == i)
			break;
		struct cand t = w->heap[i];
		w->heap[i] = w->heap[m];
		w->heap[m] = t;
		i = m;
	}
	return top;
}

static void try_pair(const struct bpe *b, struct work *w, int32_t l)
{
	if (l < 0)
		return;
	int32_t r = w->sym[l].next;
	if (r < 0)
		return;
	const struct pair *p = pair_find(b, w->sym[l].id, w->sym[r].id);
	if (!p)
		return;
	struct cand c = { p->rank, l, r, w->sym[l].id, w->sym[r].id, p->id };
	heap_push(w, &c);
}

/* Encode one pre-tokenized word s[0..n) (n > 0). */
static int encode_word(const struct bpe *b, struct work *w, const uint8_t *s, size_t n)
{
	if (b->ignore_merges || n == 1) {
		int id = n == 1 ? b->byte_id[s[0]] : tab_find(b, &b->by_bytes, b->bytes, s, n);
		if (id >= 0)
			return emit(w, id);
	}
	if (n > w->sym_cap) {
		size_t c = n * 2;
		struct sym *sy = realloc(w->sym, c * sizeof(*sy));
		if (!sy)
			return -ENOMEM;
		w->sym = sy;
		w->sym_cap = c;
		struct cand *h = realloc(w->heap, 3 * c * sizeof(*h));
		if (!h)
			return -ENOMEM;
		w->heap = h;
		w->heap_cap = 3 * c;
	}
	for (size_t i = 0; i < n; i++)
		w->sym[i] = (struct sym){ b->byte_id[s[i]], (int32_t)i - 1,
					  i + 1 < n ? (int32_t)i + 1 : -1 };
	w->n_heap = 0;
	for (size_t i = 0; i + 1 < n; i++)
		try_pair(b, w, (int32_t)i);
	while (w->n_heap) {
		struct cand c = heap_pop(w);
		struct sym *L = &w->sym[c.left], *R = &w->sym[c.right];
		if (L->id != c.lid || R->id != c.rid || L->next != c.right)
			continue;  /* stale: one side was merged since */
		L->id = c.id;
		L->next = R->next;
		if (R->next >= 0)
			w->sym[R->next].prev = c.left;
		R->id = -1;
		try_pair(b, w, L->prev);
		try_pair(b, w, c.left);
	}
	for (int32_t i = 0; i >= 0; i = w->sym[i].next) {
		int rc = emit(w, w->sym[i].id);
		if (rc)
			return rc;
	}
	return 0;
}

static int bpe_encode(const void *k, const char *text, size_t len, int add_bos, int32_t **ids)
{
	const struct bpe *b = k;
	*ids = NULL;
	if (!utf8_valid(text, len))
		return -EINVAL;
	struct work w = { 0 };
	int rc = 0;
	pcre2_match_data *md = pcre2_match_data_create_from_pattern(b->re, NULL);
	if (!md)
		return -ENOMEM;
	if (add_bos && b->bos >= 0)
		rc = emit(&w, b->bos);
	const uint8_t *u = (const uint8_t *)text;
	size_t pos = 0;
	while (rc == 0 && pos < len) {
		int m = pcre2_match(b->re, u, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
		if (m == PCRE2_ERROR_NOMATCH) {
			rc = encode_word(b, &w, u + pos, len - pos);
			break;
		}
		if (m < 0) {
			rc = m == PCRE2_ERROR_NOMEMORY ? -ENOMEM : -EINVAL;
			break;
		}
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
		size_t s = ov[0], e = ov[1];
		if (s > pos)
			rc = encode_word(b, &w, u + pos, s - pos);
		if (rc == 0 && e > s)
			rc = encode_word(b, &w, u + s, e - s);
		if (e == s) {  /* an empty match: step over one character */
			e = s + 1;
			while (e < len && (u[e] & 0xc0) == 0x80)
				e++;
			if (rc == 0)
				rc = encode_word(b, &w, u + s, e - s);
		}
		pos = e;
	}
	pcre2_match_data_free(md);
	free(w.sym);
	free(w.heap);
	if (rc == 0 && !w.out)
		rc = (w.out = malloc(sizeof(int32_t))) ? 0 : -ENOMEM;
	if (rc) {
		free(w.out);
		return rc;
	}
	*ids = w.out;
	return (int)w.n;
}

/* ---- lookups ------------------------------------------------------------------- */

static int bpe_n_vocab(const void *k)
{
	const struct bpe *b = k;
	return b->n_vocab;
}

static int bpe_bos(const void *k)
{
	const struct bpe *b = k;
	return b->bos;
}

static int bpe_eos(const void *k)
{
	const struct bpe *b = k;
	return b->eos;
}

static const int32_t *bpe_end_ids(const void *k, int *n)
{
	const struct bpe *b = k;
	*n = b->n_end;
	return b->end;
}

static const char *bpe_piece(const void *k, int id)
{
	const struct bpe *b = k;
	return id >= 0 && id < b->n_vocab ? at(b, b->piece[id]) : NULL;
}

static int bpe_piece_to_id(const void *k, const char *piece)
{
	const struct bpe *b = k;
	return tab_find(b, &b->by_piece, b->piece, piece, strlen(piece));
}

static int bpe_type(const void *k, int id)
{
	const struct bpe *b = k;
	return id >= 0 && id < b->n_vocab ? b->type[id] : 0;
}

static int bpe_bytes(const void *k, int id, const uint8_t **p, size_t *n)
{
	const struct bpe *b = k;
	if (id < 0 || id >= b->n_vocab)
		return 0;
	*p = (const uint8_t *)at(b, b->bytes[id]);
	*n = b->bytes[id].len;
	return 1;
}

static int bpe_n_merges(const void *k)
{
	const struct bpe *b = k;
	return b->n_merges;
}

static const char *bpe_merge(const void *k, int i)
{
	const struct bpe *b = k;
	return i >= 0 && i < b->n_merges ? at(b, b->merge[i]) : NULL;
}

static const char *bpe_pre(const void *k)
{
	const struct bpe *b = k;
	return b->pre->name;
}

static int bpe_is_control(const void *k, int id)
{
	int ty = bpe_type(k, id);
	return ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN;
}

const struct tok_ops tok_bpe_ops = {
	.kind = TOK_BPE,
	.free = bpe_free,
	.n_vocab = bpe_n_vocab,
	.bos = bpe_bos,
	.eos = bpe_eos,
	.encode = bpe_encode,
	.decode = NULL,          /* the streaming detokenizer over the sequence */
	.piece = bpe_piece,
	.piece_to_id = bpe_piece_to_id,
	.type = bpe_type,
	.is_control = bpe_is_control,
	.bytes = bpe_bytes,
	.n_merges = bpe_n_merges,
	.merge = bpe_merge,
	.pre = bpe_pre,
	.end_ids = bpe_end_ids,
};
