/*
 * model/chat.c — see chat.h.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat.h"

static const char *const tags[] = { "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>" };

int chat_has_tags(const char *text, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		if (text[i] != '[' && text[i] != '<')
			continue;
		for (size_t k = 0; k < sizeof(tags) / sizeof(tags[0]); k++) {
			size_t tl = strlen(tags[k]);
			if (len - i >= tl && memcmp(text + i, tags[k], tl) == 0)
				return 1;
		}
	}
	return 0;
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
	char *u = strip(user), *s = system ? strip(system) : NULL, *a = answer ? strip(answer) : NULL;
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
	if (chat_has_tags(user, strlen(user)) || (system && chat_has_tags(system, strlen(system))))
		return -EPERM;
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
		return rc;
	}
	return n;
}

int chat_encode_dialog(const struct tok *t, const struct chat_msg *msgs, int n,
		       int32_t **ids)
{
	int i = 0, len = 0, cap = 0, rc = 0;
	const char *system = NULL;
	*ids = NULL;
	for (int k = 0; k < n; k++)
		if (msgs[k].role != CHAT_ASSISTANT &&
		    chat_has_tags(msgs[k].text, strlen(msgs[k].text)))
			return -EPERM;
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
		return rc;
	}
	return len;
}
