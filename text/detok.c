/*
 * text/detok.c — streaming detokenizer.
 *
 * Turns generated ids into text one id at a time, emitting only complete,
 * valid UTF-8. The rules follow SentencePiece's whole-sequence decode, so
 * that feeding every id of a sequence and then flushing gives the same bytes
 * as tok_decode() on normal text:
 *
 *   - U+2581 '▁' in a piece becomes ' '; the leading one of the first
 *     piece of a text is dropped when the model adds a dummy prefix;
 *   - consecutive byte pieces (<0xAB>) form raw bytes; an incomplete UTF-8
 *     character is held back until its last byte arrives;
 *   - each byte that cannot start or continue a valid character becomes
 *     U+FFFD (the same per-byte rule SentencePiece applies), and any
 *     non-byte id ends a run of byte pieces, turning held-back bytes into
 *     U+FFFD;
 *   - control and unknown ids produce no text; BOS starts a new text.
 *
 * Byte-level BPE ids stand for bytes (tok_bytes), fed through the same
 * UTF-8 assembly: a character split across tokens is held back until it is
 * complete, whatever tokens carry its bytes; a control id cuts it short.
 *
 * Deliberate differences from tok_decode(): an unknown id decodes there to
 * " \u2047 " and here to nothing; a BOS in the middle of a sequence makes the
 * next piece drop its leading space here, not there.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_int.h"
#include "text/tokenizer.h"
#include "util/utf8.h"

static const char k_replacement[] = "\xef\xbf\xbd"; /* U+FFFD */
static const char k_space_symbol[] = "\xe2\x96\x81"; /* U+2581 */

/* Bounded output: out[0..len) written, cap includes the final NUL. */
struct sink {
	char *out;
	size_t cap;
	size_t len;
	int full;
};

static void sink_put(struct sink *w, const void *p, size_t n)
{
	if (w->full || w->len + n + 1 > w->cap) {
		w->full = 1;
		return;
	}
	memcpy(w->out + w->len, p, n);
	w->len += n;
}

/* Turn held-back bytes into one U+FFFD each (the sequence was cut short:
 * its lead and every continuation byte are invalid on their own). */
static void pend_break(struct detok *d, struct sink *w)
{
	for (int i = 0; i < d->n_pend; i++)
		sink_put(w, k_replacement, 3);
	d->n_pend = 0;
}

/* Add one raw byte to the stream. */
static void feed_byte(struct detok *d, struct sink *w, uint8_t b)
{
	if (d->n_pend > 0) {
		if (utf8_cont_ok(d->pend[0], d->n_pend, b)) {
			d->pend[d->n_pend++] = b;
			if (d->n_pend == utf8_seq_len(d->pend[0])) {
				sink_put(w, d->pend, (size_t)d->n_pend);
				d->n_pend = 0;
			}
			return;
		}
		pend_break(d, w);
	}
	switch (utf8_seq_len(b)) {
	case 0:
		sink_put(w, k_replacement, 3);
		break;
	case 1:
		sink_put(w, &b, 1);
		break;
	default:
		d->pend[0] = b;
		d->n_pend = 1;
		break;
	}
}

/* Add the text of an ordinary piece, U+2581 becoming ' '. */
static void feed_text(struct detok *d, struct sink *w, const char *p)
{
	size_t n = strlen(p);

	if (d->at_start && tok_drops_leading_space(d->tok) && n >= 3 &&
	    memcmp(p, k_space_symbol, 3) == 0) {
		p += 3;
		n -= 3;
	}
	d->at_start = 0;
	while (n > 0) {
		const char *sp = NULL;
		if (n >= 3)
			sp = memmem(p, n, k_space_symbol, 3);
		size_t run = sp ? (size_t)(sp - p) : n;
		sink_put(w, p, run);
		p += run;
		n -= run;
		if (sp) {
			sink_put(w, " ", 1);
			p += 3;
			n -= 3;
		}
	}
}

/*
 * detok_init — start a stream over t (borrowed; must outlive d). at_start:
 * the first piece fed is the first of a text, so its leading space (the
 * dummy prefix) is dropped.
 */
void detok_init(struct detok *d, const struct tok *t, int at_start)
{
	memset(d, 0, sizeof *d);
	d->tok = t;
	d->at_start = at_start ? 1 : 0;
}

/*
 * detok_feed — append the text of id to out (cap bytes, NUL included).
 * Returns the bytes written (0 when nothing is complete yet), -ENOSPC if
 * cap is too small (the stream is then unchanged: retry with a larger
 * buffer), or -EINVAL for an id outside the vocabulary.
 */
int detok_feed(struct detok *d, int id, char *out, size_t cap)
{
	struct detok s = *d;
	struct sink w = { out, cap, 0, 0 };
	uint8_t byte;
	const char *piece;

	if (cap == 0)
		return -ENOSPC;
	piece = tok_piece(d->tok, id);
	if (!piece)
		return -EINVAL;
	const uint8_t *bytes;
	size_t nb;
	if (tok_kind(d->tok) == TOK_BPE) {
		/* byte-level: a character may be split across tokens; only a
		 * control token cuts a held-back sequence short */
		tok_bytes(d->tok, id, &bytes, &nb);
		if (tok_is_control(d->tok, id))
			pend_break(&s, &w);
		for (size_t i = 0; i < nb; i++)
			feed_byte(&s, &w, bytes[i]);
		s.at_start = 0;
	} else if (tok_is_byte(d->tok, id, &byte)) {
		s.at_start = 0;
		feed_byte(&s, &w, byte);
	} else {
		pend_break(&s, &w);
		if (tok_is_control(d->tok, id)) {
			if (id == tok_bos(d->tok))
				s.at_start = 1;
		} else {
			feed_text(&s, &w, piece);
		}
	}
	if (w.full)
		return -ENOSPC;
	out[w.len] = '\0';
	*d = s;
	return (int)w.len;
}

/*
 * detok_flush — end the stream: held-back bytes of an incomplete character
 * are written as one U+FFFD each. Returns the bytes written, or -ENOSPC
 * (stream unchanged) if out (cap bytes, NUL included) is too small; 13
 * bytes always suffice.
 */
int detok_flush(struct detok *d, char *out, size_t cap)
{
	struct detok s = *d;
	struct sink w = { out, cap, 0, 0 };

	if (cap == 0)
		return -ENOSPC;
	pend_break(&s, &w);
	if (w.full)
		return -ENOSPC;
	out[w.len] = '\0';
	*d = s;
	return (int)w.len;
}

int detok_all(const struct tok *t, const int32_t *ids, int n, int at_start, int skip_bad,
	       char **text)
{
	size_t cap = 256, len = 0;
	char *out = malloc(cap);
	if (!out)
		return -ENOMEM;
	struct detok d;
	detok_init(&d, t, at_start);
	int vocab = tok_n_vocab(t);
	for (int i = 0; i <= n; i++) {
		if (skip_bad && i < n && (ids[i] < 0 || ids[i] >= vocab))
			continue;
		for (;;) {  /* a full buffer leaves the stream as it was: grow, retry */
			int k = i < n ? detok_feed(&d, ids[i], out + len, cap - len)
				      : detok_flush(&d, out + len, cap - len);
			if (k >= 0) {
				len += (size_t)k;
				break;
			}
			if (k != -ENOSPC || cap > (1u << 30)) {
				free(out);
				return k == -ENOSPC ? -EOVERFLOW : k;
			}
			char *o = realloc(out, cap * 2);
			if (!o) {
				free(out);
				return -ENOMEM;
			}
			out = o;
			cap *= 2;
		}
	}
	out[len] = 0;
	*text = out;
	return (int)len;
}

int tok_decode(const struct tok *t, const int32_t *ids, int n, char **text)
{
	if (!t || !text || n < 0 || (!ids && n))
		return -EINVAL;
	*text = NULL;
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= tok_n_vocab(t))
			return -EINVAL;
	/* a kind without its own whole-sequence decode (BPE): the stream */
	const void *k;
	const struct tok_ops *ops = tok_ops_of(t, &k);
	return ops->decode ? ops->decode(k, ids, n, text) : detok_all(t, ids, n, 0, 0, text);
}
