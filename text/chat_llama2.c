/*
 * text/chat_llama2.c — the Llama 2 chat template (text/chat.h says its
 * format): one "[INST] ... [/INST]" string per exchange, the system prompt
 * folded into the first user message, EOS after each answer.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_int.h"

static const char *const tags[] = { "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>" };

/* The length of the tag text starts with (of len bytes), or 0. */
static size_t tag_at(const char *text, size_t len)
{
	if (text[0] != '[' && text[0] != '<')
		return 0;
	for (size_t k = 0; k < sizeof(tags) / sizeof(tags[0]); k++) {
		size_t tl = strlen(tags[k]);
		if (len >= tl && memcmp(text, tags[k], tl) == 0)
			return tl;
	}
	return 0;
}

static int llama2_find_tag(const struct tok *t, const char *text, size_t len, char *tag,
			   size_t cap)
{
	(void)t;
	for (size_t i = 0; i < len; i++) {
		size_t tl = tag_at(text + i, len - i);
		if (tl) {
			chat_copy_tag(tag, cap, text + i, tl);
			return 1;
		}
	}
	return 0;
}

int chat_has_tags(const char *text, size_t len)
{
	return llama2_find_tag(NULL, text, len, NULL, 0);
}

static int32_t llama2_end_of_turn(const struct tok *t, int32_t eos)
{
	(void)t;
	return eos;
}

/* strdup of text without leading and trailing whitespace */
static char *strip(const char *s)
{
	while (*s && isspace((unsigned char)*s))
		s++;
	size_t n = strlen(s);
	while (n > 0 && isspace((unsigned char)s[n - 1]))
		n--;
	return strndup(s, n);
}

/* strip(), and every tag in the text neutralised by a space after its
 * first character ("[INST]" -> "[ INST]", "<</SYS>>" -> "< </SYS>>"), so
 * that client text never spells the template's own markup; NULL on
 * ENOMEM. No tag holds a space, so none can form across an insertion. */
static char *strip_tags(const char *s)
{
	char *t = strip(s);
	if (!t)
		return NULL;
	size_t len = strlen(t), n = 0;
	for (size_t i = 0; i < len; i++)
		n += tag_at(t + i, len - i) != 0;
	if (n == 0)
		return t;
	char *o = malloc(len + n + 1), *w = o;
	if (!o) {
		free(t);
		return NULL;
	}
	for (size_t i = 0; i < len; i++) {
		*w++ = t[i];
		if (tag_at(t + i, len - i))
			*w++ = ' ';
	}
	*w = 0;
	free(t);
	return o;
}

/* Append the ids of text (with BOS / EOS as asked) to *ids / *n. */
static int append(const struct tok *t, const char *text, int bos, int eos,
		  int32_t **ids, int *n, int *cap)
{
	int32_t *e = NULL;
	int k = tok_encode(t, text, strlen(text), bos, &e);
	if (k < 0)
		return k;
	int need = *n + k + 1;
	if (need > *cap) {
		int c = *cap ? *cap : 64;
		while (c < need)
			c *= 2;
		int32_t *ni = realloc(*ids, (size_t)c * sizeof(int32_t));
		if (!ni) {
			free(e);
			return -ENOMEM;
		}
		*ids = ni;
		*cap = c;
	}
	memcpy(*ids + *n, e, (size_t)k * sizeof(int32_t));
	*n += k;
	free(e);
	if (eos && tok_eos(t) >= 0)
		(*ids)[(*n)++] = tok_eos(t);
	return 0;
}

/* "[INST] {<<SYS>> block}{user} [/INST]" (+ " {answer} " if answer). */
static char *exchange_text(const char *system, const char *user, const char *answer)
{
	char *u = strip_tags(user), *s = system ? strip_tags(system) : NULL;
	char *a = answer ? strip(answer) : NULL;
	char *out = NULL;
	if (u && (!system || s) && (!answer || a)) {
		if (asprintf(&out, "[INST] %s%s%s%s [/INST]%s%s%s",
			     s ? "<<SYS>>\n" : "", s ? s : "", s ? "\n<</SYS>>\n\n" : "", u,
			     a ? " " : "", a ? a : "", a ? " " : "") < 0)
			out = NULL;
	}
	free(u);
	free(s);
	free(a);
	return out;
}

int chat_encode_user_turn(const struct tok *t, const char *system, const char *user,
			  int32_t **ids)
{
	char *text = exchange_text(system, user, NULL);
	if (!text)
		return -ENOMEM;
	int n = 0, cap = 0;
	*ids = NULL;
	int rc = append(t, text, 1, 0, ids, &n, &cap);
	free(text);
	if (rc < 0) {
		free(*ids);
		*ids = NULL;
		return rc == -ENOMEM ? rc : -EPROTO;
	}
	return n;
}

static int llama2_dialog(const struct tok *t, const struct chat_msg *msgs, int n, int32_t **ids)
{
	int i = 0, len = 0, cap = 0, rc = 0;
	const char *system = NULL;
	if (n > 0 && msgs[0].role == CHAT_SYSTEM) {
		system = msgs[0].text;
		i = 1;
	}
	if (i >= n)
		return -EINVAL;
	while (i < n) {
		if (msgs[i].role != CHAT_USER) {
			rc = -EINVAL;
			break;
		}
		const char *answer = NULL;
		if (i + 1 < n) {
			if (msgs[i + 1].role != CHAT_ASSISTANT) {
				rc = -EINVAL;
				break;
			}
			answer = msgs[i + 1].text;
		}
		char *text = exchange_text(system, msgs[i].text, answer);
		if (!text) {
			rc = -ENOMEM;
			break;
		}
		rc = append(t, text, 1, answer != NULL, ids, &len, &cap);
		free(text);
		if (rc < 0)
			break;
		system = NULL;
		i += answer ? 2 : 1;
	}
	if (rc < 0) {
		free(*ids);
		*ids = NULL;
		return rc == -EINVAL || rc == -ENOMEM ? rc : -EPROTO;
	}
	return len;
}

static int is_blank(char c)
{
	return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* ids of text followed by eos (the client's llama2 answer). */
static int encode_answer(const struct tok *t, const struct chat_ctx *c, const char *text,
			 int32_t **ids)
{
	size_t a = 0, b = strlen(text);
	while (a < b && is_blank(text[a]))
		a++;
	while (b > a && is_blank(text[b - 1]))
		b--;
	char *s = malloc(b - a + 2);
	if (!s)
		return -ENOMEM;
	memcpy(s, text + a, b - a);
	s[b - a] = ' ';
	s[b - a + 1] = 0;
	int32_t *v = NULL;
	int n = tok_encode(t, s, b - a + 1, 0, &v);
	free(s);
	if (n < 0)
		return -EPROTO;
	int32_t *w = realloc(v, (size_t)(n + 1) * sizeof(int32_t));
	if (!w) {
		free(v);
		return -ENOMEM;
	}
	w[n++] = c->eos;
	*ids = w;
	return n;
}

static int llama2_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
		       const char *text, int32_t **ids)
{
	if (role == CHAT_SYSTEM)
		return 0;
	if (role == CHAT_ASSISTANT)
		return encode_answer(t, c, text, ids);
	const char *sys = c->next_system ? c->next_system : (c->has_user_turn ? NULL : c->system);
	int32_t *u = NULL;
	int n = chat_encode_user_turn(t, sys, text, &u);
	if (n < 0)
		return n;
	if (c->open_answer) {  /* close an answer that ended without EOS */
		int32_t *v = realloc(u, (size_t)(n + 1) * sizeof(int32_t));
		if (!v) {
			free(u);
			return -ENOMEM;
		}
		memmove(v + 1, v, (size_t)n * sizeof(int32_t));
		v[0] = c->eos;
		u = v;
		n++;
	}
	*ids = u;
	return n;
}

static int llama2_first_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
			     const char *text, const int32_t *old, int n_old, int32_t **ids)
{
	if (role == CHAT_USER && text)
		return chat_encode_user_turn(t, c->system, text, ids);
	return chat_first_turn_bos(c, old, n_old, ids);
}

const struct chat_tmpl chat_llama2 = {
	.id = CHAT_TEMPLATE_LLAMA2,
	.name = "llama2",
	.marker = { "[INST]", "<<SYS>>" },
	.rules = {
		.system_sets_prompt = 1,
		.answer_at_start = 1,
		.takes_system = 1,
		.exchange_starts = 1u << CHAT_USER,
	},
	.encode_turn = llama2_turn,
	.encode_generation = chat_generation_bos,
	.encode_first_turn = llama2_first_turn,
	.encode_dialog = llama2_dialog,
	.end_of_turn = llama2_end_of_turn,
	.find_tag = llama2_find_tag,
};
