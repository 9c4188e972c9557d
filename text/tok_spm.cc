/*
 * text/tok_spm.cc — the SentencePiece kind of tokenizer.h over
 * libsentencepiece: tok_spm_ops and spm_load_mem (tok_int.h).
 *
 * The only C++ in llamad and the only file that includes sentencepiece
 * headers. Every extern "C" entry point catches all exceptions: nothing
 * thrown by the library or by the standard containers crosses into C.
 *
 * At load we precompute, per id, the piece string, whether the piece is
 * control/unknown, and the byte of a byte-fallback piece, so the lookups the
 * sampler and the streaming detokenizer do per token are plain array reads
 * and spm_piece() pointers stay valid for the tokenizer's lifetime.
 */
#include <sentencepiece_processor.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>


extern "C" {
#include "text/tokenizer.h"
#include "text/tok_int.h"
#include "util/cause.h"
}

struct spm {
	sentencepiece::SentencePieceProcessor sp;
	std::vector<std::string> pieces;   /* (n_vocab) piece text */
	std::vector<int16_t> byte_of;      /* (n_vocab) byte value, or -1 */
	std::vector<uint8_t> control;      /* (n_vocab) 1 if control/unknown */
	int n_vocab = 0;
	int bos = -1;
	int eos = -1;
	int drops_space = 1;
};

static const char k_space_symbol[] = "\xe2\x96\x81"; /* U+2581 '▁' */

/* Store "tokenizer <what>: <msg>" in *cause (if cause is not NULL). */
static void set_cause(char **cause, const char *what, const std::string &msg)
{
	cause_set(cause, "tokenizer %s: %s", what ? what : "(memory)", msg.c_str());
}

/* Parse a byte-fallback piece "<0xAB>"; -1 if piece is not one. */
static int parse_byte_piece(const std::string &p)
{
	if (p.size() != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' ||
	    p[5] != '>')
		return -1;
	int v = 0;
	for (int i = 3; i < 5; i++) {
		char c = p[i];
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= c - '0';
		else if (c >= 'A' && c <= 'F')
			v |= c - 'A' + 10;
		else if (c >= 'a' && c <= 'f')
			v |= c - 'a' + 10;
		else
			return -1;
	}
	return v;
}

/* A valid id for a special token, or -1 (sentencepiece may report the unk
 * id, or an id out of range, for a piece the model lacks). */
static int special_id(const spm *t, int id)
{
	if (id < 0 || id >= t->n_vocab || !t->sp.IsControl(id))
		return -1;
	return id;
}

/*
 * Find out whether Decode drops the leading U+2581 of the first piece (it
 * does when the normalizer has add_dummy_prefix or remove_extra_whitespaces).
 * The normalizer spec is not reachable through the installed headers, so ask
 * the library: decode one ordinary piece that starts with U+2581.
 */
static int probe_drops_space(const spm *t)
{
	for (int id = 0; id < t->n_vocab; id++) {
		const std::string &p = t->pieces[id];
		if (t->control[id] || t->byte_of[id] >= 0 || t->sp.IsUnused(id))
			continue;
		/* "▁x" with x not another U+2581: decodes to "x" or " x" */
		if (p.size() < 4 || p.compare(0, 3, k_space_symbol) != 0 ||
		    p.compare(3, 3, k_space_symbol) == 0 ||
		    p.find(k_space_symbol, 3) != std::string::npos)
			continue;
		std::string out;
		if (!t->sp.Decode(std::vector<int>{id}, &out).ok())
			return 1;
		return out == p.substr(3);
	}
	return 1;
}

/* Build a tok from a serialized ModelProto. NULL with *cause on error. */
static spm *load_serialized(const char *data, size_t len, const char *what,
			    char **cause)
{
	spm *t = new (std::nothrow) spm;
	if (!t) {
		set_cause(cause, what, "out of memory");
		return NULL;
	}
	try {
		sentencepiece::util::Status st =
			t->sp.LoadFromSerializedProto(std::string_view(data, len));
		if (!st.ok()) {
			set_cause(cause, what,
				  std::string("not a SentencePiece model (") +
				  st.ToString() + ")");
			delete t;
			return NULL;
		}
		int n = t->sp.GetPieceSize();
		if (n <= 0) {
			set_cause(cause, what,
				  "not a SentencePiece model (no pieces)");
			delete t;
			return NULL;
		}
		t->n_vocab = n;
		t->pieces.reserve(n);
		t->byte_of.assign(n, -1);
		t->control.assign(n, 0);
		for (int id = 0; id < n; id++) {
			t->pieces.push_back(t->sp.IdToPiece(id));
			if (t->sp.IsControl(id) || t->sp.IsUnknown(id))
				t->control[id] = 1;
			if (t->sp.IsByte(id))
				t->byte_of[id] = (int16_t)parse_byte_piece(
					t->pieces[id]);
		}
		t->bos = special_id(t, t->sp.bos_id());
		t->eos = special_id(t, t->sp.eos_id());
		t->drops_space = probe_drops_space(t);
		return t;
	} catch (const std::bad_alloc &) {
		set_cause(cause, what, "out of memory");
	} catch (const std::exception &e) {
		set_cause(cause, what,
			  std::string("not a SentencePiece model (") + e.what() +
			  ")");
	} catch (...) {
		set_cause(cause, what, "not a SentencePiece model");
	}
	delete t;
	return NULL;
}

/* spm_load_mem — parse a serialized ModelProto (copied; data may be freed
 * after). Errors as tok_load, naming `what`. */
extern "C" void *spm_load_mem(const void *data, size_t len, const char *what,
			      char **cause)
{
	if (!data && len) {
		set_cause(cause, what, "no data given");
		return NULL;
	}
	return load_serialized(static_cast<const char *>(data), len, what,
			       cause);
}

/* spm_free — release t; accepts NULL. */
static void spm_free(void *k)
{
	delete static_cast<spm *>(k);
}

/* spm_n_vocab — number of pieces. */
static int spm_n_vocab(const void *k)
{
	const spm *t = static_cast<const spm *>(k);
	return t->n_vocab;
}

/* spm_bos — BOS id, or -1 if the model has no control piece for it. */
static int spm_bos(const void *k)
{
	const spm *t = static_cast<const spm *>(k);
	return t->bos;
}

/* spm_eos — EOS id, or -1 if the model has no control piece for it. */
static int spm_eos(const void *k)
{
	const spm *t = static_cast<const spm *>(k);
	return t->eos;
}

/* spm_encode — ids of text[0..len) into a malloc'd *ids (never NULL on
 * success, even for 0 ids); BOS first if add_bos and the model has one.
 * Returns the count, -EINVAL, -ENOMEM or -EOVERFLOW. */
static int spm_encode(const void *k, const char *text, size_t len, int add_bos,
		      int32_t **ids)
{
	const spm *t = static_cast<const spm *>(k);
	if (!t || !ids || (!text && len))
		return -EINVAL;
	*ids = NULL;
	try {
		std::vector<int> v;
		if (!t->sp.Encode(std::string_view(text ? text : "", len), &v)
		    .ok())
			return -EINVAL;
		int bos = add_bos && t->bos >= 0;
		if (v.size() + bos > (size_t)INT_MAX)
			return -EOVERFLOW;
		size_t n = v.size() + bos;
		int32_t *out = (int32_t *)malloc((n ? n : 1) * sizeof *out);
		if (!out)
			return -ENOMEM;
		if (bos)
			out[0] = t->bos;
		for (size_t i = 0; i < v.size(); i++)
			out[bos + i] = v[i];
		*ids = out;
		return (int)n;
	} catch (const std::bad_alloc &) {
		return -ENOMEM;
	} catch (...) {
		return -EINVAL;
	}
}

/* spm_decode — sentencepiece's whole-sequence decode into a malloc'd,
 * NUL-terminated *text. Returns its length; -EINVAL for an id out of
 * range, -ENOMEM. */
static int spm_decode(const void *k, const int32_t *ids, int n, char **text)
{
	const spm *t = static_cast<const spm *>(k);
	if (!t || !text || n < 0 || (!ids && n))
		return -EINVAL;
	*text = NULL;
	try {
		std::vector<int> v(ids, ids + n);
		for (int id : v)
			if (id < 0 || id >= t->n_vocab)
				return -EINVAL;
		std::string s;
		if (!t->sp.Decode(v, &s).ok())
			return -EINVAL;
		if (s.size() > (size_t)INT_MAX)
			return -EOVERFLOW;
		char *out = (char *)malloc(s.size() + 1);
		if (!out)
			return -ENOMEM;
		memcpy(out, s.data(), s.size());
		out[s.size()] = '\0';
		*text = out;
		return (int)s.size();
	} catch (const std::bad_alloc &) {
		return -ENOMEM;
	} catch (...) {
		return -EINVAL;
	}
}

/* spm_piece — piece string of id (owned by t), NULL if out of range. */
static const char *spm_piece(const void *k, int id)
{
	const spm *t = static_cast<const spm *>(k);
	if (id < 0 || id >= t->n_vocab)
		return NULL;
	return t->pieces[id].c_str();
}

/* spm_piece_to_id — id of an exact piece string, -1 if absent. */
static int spm_piece_to_id(const void *k, const char *piece)
{
	const spm *t = static_cast<const spm *>(k);
	if (!piece)
		return -1;
	try {
		int id = t->sp.PieceToId(piece);
		/* sentencepiece answers the unk id for an absent piece */
		if (id < 0 || id >= t->n_vocab || t->pieces[id] != piece)
			return -1;
		return id;
	} catch (...) {
		return -1;
	}
}

/* spm_is_byte — 1 and *byte (if byte is not NULL) for <0xAB> pieces. */
static int spm_is_byte(const void *k, int id, uint8_t *byte)
{
	const spm *t = static_cast<const spm *>(k);
	if (id < 0 || id >= t->n_vocab || t->byte_of[id] < 0)
		return 0;
	if (byte)
		*byte = (uint8_t)t->byte_of[id];
	return 1;
}

/* spm_is_control — 1 for control and unknown pieces, 0 otherwise (and for
 * ids out of range). */
static int spm_is_control(const void *k, int id)
{
	const spm *t = static_cast<const spm *>(k);
	if (id < 0 || id >= t->n_vocab)
		return 0;
	return t->control[id];
}

/* spm_score — sentencepiece's GetScore(id); 0 out of range. */
static float spm_score(const void *k, int id)
{
	const spm *t = static_cast<const spm *>(k);
	if (id < 0 || id >= t->n_vocab)
		return 0;
	try {
		return t->sp.GetScore(id);
	} catch (...) {
		return 0;
	}
}

/* spm_type — the piece's type from sentencepiece's Is* predicates, in
 * GGUF's numbering; 0 out of range. */
static int spm_type(const void *k, int id)
{
	const spm *t = static_cast<const spm *>(k);
	if (id < 0 || id >= t->n_vocab)
		return 0;
	try {
		if (t->sp.IsUnknown(id))
			return TOK_TYPE_UNKNOWN;
		if (t->sp.IsControl(id))
			return TOK_TYPE_CONTROL;
		if (t->sp.IsByte(id))
			return TOK_TYPE_BYTE;
		if (t->sp.IsUnused(id))
			return TOK_TYPE_UNUSED;
		return TOK_TYPE_NORMAL;
	} catch (...) {
		return TOK_TYPE_NORMAL;
	}
}

/* spm_drops_leading_space — probed at load, see probe_drops_space(). */
static int spm_drops_leading_space(const void *k)
{
	const spm *t = static_cast<const spm *>(k);
	return t->drops_space;
}

extern "C" const struct tok_ops tok_spm_ops = {
	TOK_SPM,
	spm_free,
	spm_n_vocab,
	spm_bos,
	spm_eos,
	spm_encode,
	spm_decode,
	spm_piece,
	spm_piece_to_id,
	spm_type,
	spm_is_control,
	spm_is_byte,
	spm_score,
	NULL,                    /* bytes: its pieces are text with U+2581 */
	spm_drops_leading_space,
	NULL, NULL, NULL,        /* merges and pre-tokenizer: BPE only */
	NULL,                    /* end ids: EOS only */
};
