/*
 * text/chat.c — see chat.h: the rows of the templates (chat_int.h) and
 * which one a call is for.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_int.h"

/* The templates; a model file's template text is classified in this
 * order. */
static const struct chat_tmpl *const rows[] = { &chat_llama3, &chat_llama2, &chat_raw };

/* The row of template tmpl: raw's for a value no row has (sessions and
 * settings hold known values only). */
static const struct chat_tmpl *row(int tmpl)
{
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
		if ((int)rows[i]->id == tmpl)
			return rows[i];
	return &chat_raw;
}

const char *chat_template_name(int tmpl)
{
	if (tmpl == CHAT_TEMPLATE_AUTO)
		return "auto";  /* TEMPLATE_DEFAULT, a setting only */
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
		if ((int)rows[i]->id == tmpl)
			return rows[i]->name;
	return "?";
}

enum chat_template chat_classify_template(const char *text, size_t len)
{
	for (size_t i = 0; text && i < sizeof rows / sizeof rows[0]; i++) {
		const char *const *mk = rows[i]->marker;
		if (mk[0] && memmem(text, len, mk[0], strlen(mk[0])) &&
		    memmem(text, len, mk[1], strlen(mk[1])))
			return rows[i]->id;
	}
	return CHAT_TEMPLATE_AUTO;
}

enum chat_template chat_resolve_template(int setting, int file_tmpl, int file_has_text,
					 char *why, size_t cap)
{
	const char *fdesc = file_tmpl != CHAT_TEMPLATE_AUTO ? chat_template_name(file_tmpl)
			    : file_has_text ? "a chat template llamad does not know"
					    : "no chat template";
	if (setting > CHAT_TEMPLATE_AUTO && setting <= CHAT_TEMPLATE_MAX) {
		snprintf(why, cap, "%s (set by the template setting; the model file names %s)",
			 chat_template_name(setting), fdesc);
		return (enum chat_template)setting;
	}
	if (file_tmpl != CHAT_TEMPLATE_AUTO) {
		snprintf(why, cap, "%s (from the model file's chat template)",
			 chat_template_name(file_tmpl));
		return (enum chat_template)file_tmpl;
	}
	snprintf(why, cap, "llama2 (the built-in default: the model file has %s; "
		 "set template = llama3, llama2 or raw to choose)", fdesc);
	return CHAT_TEMPLATE_LLAMA2;
}

const struct chat_rules *chat_rules(int tmpl)
{
	return &row(tmpl)->rules;
}

const char *chat_template_unusable(const struct tok *t, int tmpl)
{
	const struct chat_tmpl *r = row(tmpl);
	return r->unusable ? r->unusable(t) : NULL;
}

int32_t chat_end_of_turn(const struct tok *t, int tmpl, int32_t eos)
{
	const struct chat_tmpl *r = row(tmpl);
	return r->end_of_turn ? r->end_of_turn(t, eos) : -1;
}

int chat_find_tag(const struct tok *t, int tmpl, const char *text, size_t len, char *tag,
		  size_t cap)
{
	const struct chat_tmpl *r = row(tmpl);
	return r->find_tag ? r->find_tag(t, text, len, tag, cap) : 0;
}

int chat_encode_dialog(const struct tok *t, int tmpl, const struct chat_msg *msgs, int n,
		       int32_t **ids)
{
	const struct chat_tmpl *r = row(tmpl);
	*ids = NULL;
	return r->encode_dialog ? r->encode_dialog(t, msgs, n, ids) : -EINVAL;
}

int chat_encode_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
		     const char *text, int32_t **ids)
{
	*ids = NULL;
	const struct chat_tmpl *r = role == CHAT_RAW ? &chat_raw : row(c->tmpl);
	return r->encode_turn(t, c, role, text, ids);
}

int chat_encode_generation(const struct tok *t, const struct chat_ctx *c, int32_t **ids)
{
	*ids = NULL;
	return row(c->tmpl)->encode_generation(t, c, ids);
}

int chat_encode_first_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
			   const char *text, const int32_t *old, int n_old, int32_t **ids)
{
	*ids = NULL;
	return row(c->tmpl)->encode_first_turn(t, c, role, text, old, n_old, ids);
}

int chat_answer_start(const struct tok *t, int tmpl, const int32_t *ids, int n)
{
	const struct chat_tmpl *r = row(tmpl);
	int s = r->answer_start ? r->answer_start(t, ids, n) : 0;
	while (s < n && tok_is_control(t, ids[s]))
		s++;
	return s;
}

int chat_answer_text(const struct tok *t, int tmpl, const int32_t *ids, int n, char **text)
{
	const struct chat_tmpl *r = row(tmpl);
	int s = r->answer_start ? r->answer_start(t, ids, n) : 0;
	return detok_all(t, ids + s, n - s, r->rules.answer_at_start, 1, text);
}
