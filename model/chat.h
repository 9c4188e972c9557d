/*
 * model/chat.h — prompt templates: Llama 2 chat and raw text.
 *
 * Llama 2 chat, per finished exchange (user u, answer a; the system prompt s
 * is folded into the first user message):
 *   <s>[INST] <<SYS>>\n{s}\n<</SYS>>\n\n{u} [/INST] {a} </s>
 * and the last, unanswered user turn gets BOS and no EOS:
 *   <s>[INST] {u} [/INST]
 * Each exchange is encoded as one string (as Meta's reference does), text
 * stripped of surrounding whitespace. User or system text containing the
 * tags [INST], [/INST], <<SYS>> or <</SYS>> is refused (-EPERM).
 */
#ifndef LLAMAD_MODEL_CHAT_H
#define LLAMAD_MODEL_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"

enum chat_role { CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT };
enum chat_template { CHAT_TEMPLATE_LLAMA2, CHAT_TEMPLATE_RAW };

struct chat_msg {
	enum chat_role role;
	const char *text;
};

/* 1 if text contains a Llama 2 control tag. */
int chat_has_tags(const char *text, size_t len);

/*
 * Encode a whole dialog: an optional leading system message, then user and
 * assistant messages alternating, starting with user. The result ends with
 * the last user turn open (ready to generate) if the dialog ends with a user
 * message. Returns the number of ids with *ids malloc'd, or -EINVAL (bad
 * order), -EPERM (control tags in text), -ENOMEM.
 */
int chat_encode_dialog(const struct tok *t, const struct chat_msg *msgs, int n,
		       int32_t **ids);

/*
 * Encode one user turn for an ongoing session: BOS + "[INST] {sys}{u} [/INST]"
 * where sys is the <<SYS>> block when `system` is non-NULL (first turn).
 * Same return convention.
 */
int chat_encode_user_turn(const struct tok *t, const char *system, const char *user,
			  int32_t **ids);

#endif
