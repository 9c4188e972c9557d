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

/* The one set of roles and templates: sessions store them, state files
 * record them, and the values match proto/llamad.proto's Role and Template. */
enum chat_role { CHAT_USER = 0, CHAT_SYSTEM = 1, CHAT_ASSISTANT = 2, CHAT_RAW = 3 };
enum chat_template { CHAT_TEMPLATE_LLAMA2 = 1, CHAT_TEMPLATE_RAW = 2 };
#define CHAT_ROLE_MAX CHAT_RAW
#define CHAT_TEMPLATE_MAX CHAT_TEMPLATE_RAW

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

/* What a new turn's tokens depend on in the conversation it joins. */
struct chat_ctx {
	enum chat_template tmpl;
	int32_t bos, eos;        /* the model's ids */
	int n_tokens;            /* tokens so far (0: the turn opens the conversation) */
	int has_user_turn;       /* a user turn exists already */
	int open_answer;         /* the last turn is an answer that did not end with EOS */
	const char *system;      /* the conversation's system prompt (llama2) */
	const char *next_system; /* a system turn waiting for the next user turn */
};

/*
 * Encode a client's turn of `role` joining the conversation c (the turn
 * rules of each template):
 *  - raw template, or role CHAT_RAW: the text as is, BOS only when it opens
 *    the conversation; a continuation that starts with its own space gives
 *    up that space (SentencePiece puts one before every text it encodes);
 *  - llama2 user turn: chat_encode_user_turn with the pending system turn,
 *    else the system prompt if this is the first user turn; preceded by EOS
 *    when it closes an answer that ended without one;
 *  - llama2 system turn: no tokens (it sets the system prompt of the next
 *    user turn; the caller stores the text): returns 0;
 *  - llama2 answer written by the client: " {a} " + EOS, stripped as in
 *    Meta's format.
 * Returns the number of ids (*ids malloc'd, NULL when 0), or -EPERM (a
 * control tag in user or system text), -EPROTO (the tokenizer failed),
 * -ENOMEM.
 */
int chat_encode_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
		     const char *text, int32_t **ids);

/*
 * The tokens a conversation's first turn takes after the turns before it
 * were dropped (context shift): a llama2 user turn with its text is encoded
 * again with the system prompt (c->system); any other turn, whose tokens
 * are old[0, n_old), gets BOS in front unless it starts with it. Returns
 * the number of ids (*ids malloc'd), 0 if the turn can stay as it is, or
 * -EPERM, -EPROTO, -ENOMEM.
 */
int chat_encode_first_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
			   const char *text, const int32_t *old, int n_old, int32_t **ids);

#endif
