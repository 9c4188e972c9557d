/*
 * text/chat_int.h — inside text/: a chat template is one row of this
 * table (struct chat_tmpl); text/chat.c finds the row of a session's
 * template and calls it. A new template is a new file with its row, added
 * to chat.c's list. Not for other folders: they call text/chat.h.
 */
#ifndef LLAMAD_TEXT_CHAT_INT_H
#define LLAMAD_TEXT_CHAT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "text/chat.h"
#include "text/tokenizer.h"

struct chat_tmpl {
	enum chat_template id;
	/* chat_template_name's: the wire's name of the value (llamad.proto's
	 * Template, TEMPLATE_ dropped, lowercased; test_chat compares) */
	const char *name;
	/* a model file's template text is this one when it holds both
	 * (NULL: never classified as this one) */
	const char *marker[2];
	struct chat_rules rules;
	/* chat_encode_turn's rule for this template (roles other than raw) */
	int (*encode_turn)(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
			   const char *text, int32_t **ids);
	/* chat_encode_generation's */
	int (*encode_generation)(const struct tok *t, const struct chat_ctx *c, int32_t **ids);
	/* chat_encode_first_turn's */
	int (*encode_first_turn)(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
				 const char *text, const int32_t *old, int n_old, int32_t **ids);
	/* chat_encode_dialog's; NULL: no dialogs (-EINVAL) */
	int (*encode_dialog)(const struct tok *t, const struct chat_msg *msgs, int n,
			     int32_t **ids);
	/* the id that ends a turn; NULL: none (-1) */
	int32_t (*end_of_turn)(const struct tok *t, int32_t eos);
	/* the control-tag finder (chat_find_tag); NULL: none */
	int (*find_tag)(const struct tok *t, const char *text, size_t len, char *tag, size_t cap);
	/* why t cannot encode this template; NULL: any vocabulary can */
	const char *(*unusable)(const struct tok *t);
	/* where an answer's own tokens start in its turn's ids; NULL: 0 */
	int (*answer_start)(const struct tok *t, const int32_t *ids, int n);
};

extern const struct chat_tmpl chat_llama2;   /* chat_llama2.c */
extern const struct chat_tmpl chat_llama3;   /* chat_llama3.c */
extern const struct chat_tmpl chat_raw;      /* chat_raw.c */

/* Rules the rows share (chat_common.c). */
/* BOS alone when the conversation is empty, else nothing (what raw and
 * llama2 generations need in front). */
int chat_generation_bos(const struct tok *t, const struct chat_ctx *c, int32_t **ids);
/* A first turn after a shift that is not encoded again: BOS in front of
 * its tokens old[0, n_old) unless it starts with it (0: it stays). */
int chat_first_turn_bos(const struct chat_ctx *c, const int32_t *old, int n_old,
			int32_t **ids);
/* Copy text[0, n) into tag (cap), NUL-terminated, cut to fit. */
void chat_copy_tag(char *tag, size_t cap, const char *text, size_t n);

#endif
