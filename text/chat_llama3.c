/*
 * text/chat_llama3.c — the Llama 3 chat template (text/chat.h says its
 * format): every message between <|start_header_id|>role<|end_header_id|>
 * and <|eot_id|>, the control tokens put in by id, the text trimmed as
 * Jinja's trim does.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_int.h"
#include "util/grow.h"

/* The Llama 3 control tokens a conversation needs. */
struct l3_ids {
	int32_t bos, start, end, eot;
};

/* t's Llama 3 ids: 0, or -ENOTSUP if the vocabulary lacks one. */
static int l3_ids(const struct tok *t, struct l3_ids *l)
{
	l->bos = tok_piece_to_id(t, "<|begin_of_text|>");
	l->start = tok_piece_to_id(t, "<|start_header_id|>");
	l->end = tok_piece_to_id(t, "<|end_header_id|>");
	l->eot = tok_piece_to_id(t, "<|eot_id|>");
	if (l->bos < 0 || l->start < 0 || l->end < 0 || l->eot < 0)
		return -ENOTSUP;
	return 0;
}

static const char *llama3_unusable(const struct tok *t)
{
	struct l3_ids l;
	if (l3_ids(t, &l) != 0)
		return "the llama3 template needs the Llama 3 vocabulary (<|begin_of_text|>, "
		       "<|start_header_id|>, <|end_header_id|>, <|eot_id|>), which this model lacks";
	return NULL;
}

static int32_t llama3_end_of_turn(const struct tok *t, int32_t eos)
{
	(void)eos;
	return tok_piece_to_id(t, "<|eot_id|>");
}

/* The longest name of a "<|name|>" looked up in the vocabulary. */
#define L3_NAME_MAX 128

static int llama3_find_tag(const struct tok *t, const char *text, size_t len, char *tag,
			   size_t cap)
{
	char piece[L3_NAME_MAX + 5];  /* "<|", the name, "|>", NUL */
	for (size_t i = 0; i + 4 <= len; i++) {
		if (text[i] != '<' || text[i + 1] != '|')
			continue;
		/* "<|" name "|>", the name without '|' (as every Llama 3 control
		 * token's): one look-up per "<|", so the search stays linear */
		size_t j = i + 2;
		while (j < len && j - (i + 2) < L3_NAME_MAX && text[j] != '|' && text[j] != 0)
			j++;
		if (j + 1 >= len || text[j] != '|' || text[j + 1] != '>')
			continue;
		size_t n = j + 2 - i;
		memcpy(piece, text + i, n);
		piece[n] = 0;
		int id = tok_piece_to_id(t, piece);
		if (id >= 0 && tok_type(t, id) == TOK_TYPE_CONTROL) {
			chat_copy_tag(tag, cap, piece, n);
			return 1;
		}
	}
	return 0;
}

/* A growing array of ids. */
struct idv {
	int32_t *v;
	int n;
	size_t cap;
};

static int idv_push(struct idv *a, const int32_t *ids, int n)
{
	if (grow(&a->v, &a->cap, (size_t)(a->n + n), sizeof(int32_t), 64))
		return -ENOMEM;
	if (n > 0)
		memcpy(a->v + a->n, ids, (size_t)n * sizeof(int32_t));
	a->n += n;
	return 0;
}

static int idv_put(struct idv *a, int32_t id)
{
	return idv_push(a, &id, 1);
}

/* Append the ids of len bytes of text (no BOS). 0, -EPROTO or -ENOMEM. */
static int idv_text(struct idv *a, const struct tok *t, const char *text, size_t len)
{
	if (len == 0)
		return 0;
	int32_t *e = NULL;
	int k = tok_encode(t, text, len, 0, &e);
	if (k < 0)
		return k == -ENOMEM ? k : -EPROTO;
	int rc = idv_push(a, e, k);
	free(e);
	return rc;
}

/* The ids of a (*ids, NULL when none) and their count, or err after freeing
 * them. */
static int idv_done(struct idv *a, int err, int32_t **ids)
{
	if (err < 0 || a->n == 0) {
		free(a->v);
		*ids = NULL;
		return err < 0 ? err : 0;
	}
	*ids = a->v;
	return a->n;
}

/*
 * Whitespace that Jinja's trim removes: Python's str.strip(), whose
 * whitespace is str.isspace(): U+0009-U+000D, U+001C-U+001F, U+0020,
 * U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
 * U+3000.
 */
static int trim_space(uint32_t c)
{
	return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Bytes of the whitespace character that starts s[0, n), 0 if it is not
 * one (none is longer than 3 bytes in UTF-8). */
static size_t space_at(const unsigned char *s, size_t n)
{
	uint32_t c;
	size_t k;
	if (n >= 1 && s[0] < 0x80) {
		c = s[0];
		k = 1;
	} else if (n >= 2 && (s[0] & 0xe0) == 0xc0 && (s[1] & 0xc0) == 0x80) {
		c = (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
		k = 2;
	} else if (n >= 3 && (s[0] & 0xf0) == 0xe0 && (s[1] & 0xc0) == 0x80 &&
		   (s[2] & 0xc0) == 0x80) {
		c = (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
		k = 3;
	} else {
		return 0;
	}
	return trim_space(c) ? k : 0;
}

/* text without the whitespace around it: its start and length in *len. */
static const char *trimmed(const char *text, size_t *len)
{
	const unsigned char *s = (const unsigned char *)text;
	size_t n = strlen(text), k;
	while ((k = space_at(s, n)) > 0) {
		s += k;
		n -= k;
	}
	while (n > 0) {
		size_t j = n - 1;  /* the start of the last character */
		while (j > 0 && n - j < 3 && (s[j] & 0xc0) == 0x80)
			j--;
		if (space_at(s + j, n - j) != n - j)
			break;
		n = j;
	}
	*len = n;
	return (const char *)s;
}

static const char *const role_names[] = {
	[CHAT_USER] = "user", [CHAT_SYSTEM] = "system", [CHAT_ASSISTANT] = "assistant",
};

/* <|start_header_id|>{role}<|end_header_id|> */
static int l3_header(struct idv *a, const struct tok *t, const struct l3_ids *l,
		     enum chat_role role)
{
	int rc = idv_put(a, l->start);
	if (!rc)
		rc = idv_text(a, t, role_names[role], strlen(role_names[role]));
	if (!rc)
		rc = idv_put(a, l->end);
	return rc;
}

/* "{text}" <|eot_id|> with text trimmed, after prefix ("\n\n" or ""). */
static int l3_body(struct idv *a, const struct tok *t, const struct l3_ids *l,
		   const char *prefix, const char *text)
{
	size_t n, p = strlen(prefix);
	const char *s = trimmed(text, &n);
	char *buf = malloc(p + n + 1);
	if (!buf)
		return -ENOMEM;
	memcpy(buf, prefix, p);
	memcpy(buf + p, s, n);
	int rc = idv_text(a, t, buf, p + n);
	free(buf);
	return rc ? rc : idv_put(a, l->eot);
}

/* A whole message: header, "\n\n{text}", <|eot_id|>. */
static int l3_message(struct idv *a, const struct tok *t, const struct l3_ids *l,
		      enum chat_role role, const char *text)
{
	int rc = l3_header(a, t, l, role);
	return rc ? rc : l3_body(a, t, l, "\n\n", text);
}

/* The generation prompt: the assistant header and "\n\n". */
static int l3_generation(struct idv *a, const struct tok *t, const struct l3_ids *l)
{
	int rc = l3_header(a, t, l, CHAT_ASSISTANT);
	return rc ? rc : idv_text(a, t, "\n\n", 2);
}

/* The conversation's BOS (the tokenizer's, as the template's bos_token). */
static int32_t l3_bos(const struct tok *t, const struct l3_ids *l)
{
	return tok_bos(t) >= 0 ? tok_bos(t) : l->bos;
}

static int llama3_dialog(const struct tok *t, const struct chat_msg *msgs, int n, int32_t **ids)
{
	struct l3_ids l;
	if (l3_ids(t, &l) != 0)
		return -ENOTSUP;
	if (n <= 0)
		return -EINVAL;
	for (int k = 0; k < n; k++) {
		if (msgs[k].role != CHAT_USER && msgs[k].role != CHAT_SYSTEM &&
		    msgs[k].role != CHAT_ASSISTANT)
			return -EINVAL;
	}
	struct idv a = { 0 };
	int rc = idv_put(&a, l3_bos(t, &l));
	for (int k = 0; k < n && !rc; k++)
		rc = l3_message(&a, t, &l, msgs[k].role, msgs[k].text);
	if (!rc)
		rc = l3_generation(&a, t, &l);
	return idv_done(&a, rc, ids);
}

/* <|begin_of_text|> and the system prompt's message, when c opens. */
static int l3_opening(struct idv *a, const struct tok *t, const struct l3_ids *l,
		      const struct chat_ctx *c)
{
	if (c->n_tokens > 0)
		return 0;
	int rc = idv_put(a, c->bos >= 0 ? c->bos : l3_bos(t, l));
	if (!rc && c->system)
		rc = l3_message(a, t, l, CHAT_SYSTEM, c->system);
	return rc;
}

static int llama3_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
		       const char *text, int32_t **ids)
{
	struct l3_ids l;
	if (l3_ids(t, &l) != 0)
		return -ENOTSUP;
	struct idv a = { 0 };
	int rc = c->open_answer ? idv_put(&a, l.eot) : 0;
	if (!rc)
		rc = l3_opening(&a, t, &l, c);
	if (!rc) {
		switch (role) {
		case CHAT_USER:
			rc = l3_message(&a, t, &l, CHAT_USER, text);
			if (!rc)
				rc = l3_generation(&a, t, &l);
			break;
		case CHAT_SYSTEM:
			rc = l3_message(&a, t, &l, CHAT_SYSTEM, text);
			break;
		case CHAT_ASSISTANT:
			/* after a user turn, whose generation prompt opened it */
			if (c->n_tokens > 0 && c->last_role == CHAT_USER && !c->open_answer)
				rc = l3_body(&a, t, &l, "", text);
			else
				rc = l3_message(&a, t, &l, CHAT_ASSISTANT, text);
			break;
		default:
			rc = -EINVAL;
		}
	}
	return idv_done(&a, rc, ids);
}

static int llama3_generation(const struct tok *t, const struct chat_ctx *c, int32_t **ids)
{
	if (c->n_tokens > 0 && (c->last_role == CHAT_USER || c->last_role == CHAT_RAW ||
				c->open_answer))
		return 0;
	struct l3_ids l;
	if (l3_ids(t, &l) != 0)
		return -ENOTSUP;
	struct idv a = { 0 };
	int rc = l3_opening(&a, t, &l, c);
	if (!rc)
		rc = l3_generation(&a, t, &l);
	return idv_done(&a, rc, ids);
}

static int llama3_first_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
			     const char *text, const int32_t *old, int n_old, int32_t **ids)
{
	if ((role == CHAT_USER || role == CHAT_SYSTEM) && text) {
		struct chat_ctx first = *c;
		first.n_tokens = 0;
		first.last_role = -1;
		first.open_answer = 0;
		return llama3_turn(t, &first, role, text, ids);
	}
	return chat_first_turn_bos(c, old, n_old, ids);
}

/* Where an answer's own tokens start in ids[0, n): after BOS and the
 * assistant header and "\n\n" when the turn opens with them. */
static int llama3_answer_start(const struct tok *t, const int32_t *ids, int n)
{
	struct l3_ids l;
	if (l3_ids(t, &l) != 0)
		return 0;
	int i = 0;
	while (i < n && ids[i] != l.start && tok_is_control(t, ids[i]))
		i++;
	if (i >= n || ids[i] != l.start)
		return 0;
	int k = i + 1;
	while (k < n && ids[k] != l.end)
		k++;
	if (k >= n)
		return 0;
	k++;
	int32_t *nl = NULL;
	int m = tok_encode(t, "\n\n", 2, 0, &nl);
	if (m > 0 && k + m <= n && memcmp(ids + k, nl, (size_t)m * sizeof(int32_t)) == 0)
		k += m;
	free(nl);
	return k;
}

const struct chat_tmpl chat_llama3 = {
	.id = CHAT_TEMPLATE_LLAMA3,
	.name = "llama3",
	.marker = { "<|start_header_id|>", "<|eot_id|>" },
	.rules = {
		.prompt_opens_answer = 1,
		.shift_keeps_system = 1,
		.answer_at_start = 1,
		.takes_system = 1,
		.exchange_starts = 1u << CHAT_USER | 1u << CHAT_SYSTEM,
	},
	.encode_turn = llama3_turn,
	.encode_generation = llama3_generation,
	.encode_first_turn = llama3_first_turn,
	.encode_dialog = llama3_dialog,
	.end_of_turn = llama3_end_of_turn,
	.find_tag = llama3_find_tag,
	.unusable = llama3_unusable,
	.answer_start = llama3_answer_start,
};
