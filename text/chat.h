/*
 * text/chat.h — chat templates: which tokens a conversation's turns take.
 * One row of functions per template (text/chat_int.h): Llama 2 chat
 * (text/chat_llama2.c), Llama 3 chat (text/chat_llama3.c) and raw text
 * (text/chat_raw.c); text/chat.c sends each call to the template's row,
 * classifies a model file's template text and says which template new
 * sessions get. Adding a family is one file and one row.
 *
 * Llama 2 chat, per finished exchange (user u, answer a; the system prompt s
 * is folded into the first user message):
 *   <s>[INST] <<SYS>>\n{s}\n<</SYS>>\n\n{u} [/INST] {a} </s>
 * and the last, unanswered user turn gets BOS and no EOS:
 *   <s>[INST] {u} [/INST]
 * Each exchange is encoded as one string (as Meta's reference does), text
 * stripped of surrounding whitespace. User or system text never spells the
 * markup: each [INST], [/INST], <<SYS>> or <</SYS>> in it is neutralised by
 * a space after its first character ("[ INST]", "< </SYS>>") before it is
 * encoded (the transcript keeps the text as sent).
 *
 * Llama 3 chat (the chat_template of Meta-Llama-3-*-Instruct's
 * tokenizer_config.json): <|begin_of_text|> once, at the start of the
 * conversation, then every message, system messages included, as
 *   <|start_header_id|>{role}<|end_header_id|> "\n\n{text}" <|eot_id|>
 * with text trimmed of surrounding whitespace (Jinja's trim), and to generate
 * the assistant header and "\n\n":
 *   <|start_header_id|>assistant<|end_header_id|> "\n\n"
 * The <|...|> ids are put in by id (tok_piece_to_id); only the quoted parts
 * go through tok_encode, each on its own, as the model's tokenizer does
 * when it splits the rendered text at its special tokens. User or system
 * text that spells a control token ("<|eot_id|>") stays text: tok_encode
 * never makes a control token from text, so nothing needs refusing.
 */
#ifndef LLAMAD_TEXT_CHAT_H
#define LLAMAD_TEXT_CHAT_H

#include <stddef.h>
#include <stdint.h>

struct tok;


/* The one set of roles and templates: sessions store them, state files
 * record them, and the values match proto/llamad.proto's Role and Template.
 * CHAT_TEMPLATE_AUTO (0, the wire's TEMPLATE_DEFAULT) is a setting only:
 * "the model file's template" (chat_resolve_template); no session has it. */
enum chat_role { CHAT_USER = 0, CHAT_SYSTEM = 1, CHAT_ASSISTANT = 2, CHAT_RAW = 3 };
enum chat_template {
	CHAT_TEMPLATE_AUTO = 0,
	CHAT_TEMPLATE_LLAMA2 = 1,
	CHAT_TEMPLATE_RAW = 2,
	CHAT_TEMPLATE_LLAMA3 = 3,
};
#define CHAT_ROLE_MAX CHAT_RAW
#define CHAT_TEMPLATE_MAX CHAT_TEMPLATE_LLAMA3

struct chat_msg {
	enum chat_role role;
	const char *text;
};

/* "auto", "llama2", "raw", "llama3"; "?" for other values. */
const char *chat_template_name(int tmpl);

/*
 * What a model file's chat template text is (a Jinja template, len bytes):
 * the first template whose two markers it holds, llama3 (<|start_header_id|>
 * and <|eot_id|>) before llama2 ([INST] and <<SYS>>); CHAT_TEMPLATE_AUTO
 * when none (unknown, or no text).
 */
enum chat_template chat_classify_template(const char *text, size_t len);

/*
 * The template of new sessions that choose none. setting: the configured
 * template (CHAT_TEMPLATE_AUTO: the model file's); file_tmpl: the model
 * file's (chat_classify_template's; CHAT_TEMPLATE_AUTO: unknown or none);
 * file_has_text: the file has a chat template at all. A file whose
 * template is unknown or absent gets llama2, the built-in default, and
 * *why says so. Writes one line into why (cap bytes) saying which template
 * and why, e.g. "llama3 (from the model file's chat template)". Returns
 * the template.
 */
enum chat_template chat_resolve_template(int setting, int file_tmpl, int file_has_text,
					 char *why, size_t cap);

/* How sessions hold turns under a template (session/turns.c). */
struct chat_rules {
	unsigned system_sets_prompt : 1;  /* a system turn takes no tokens: it is the
					   * system prompt of the next user turn (llama2) */
	unsigned turns_are_raw : 1;       /* every client turn is stored as raw (raw) */
	unsigned prompt_opens_answer : 1; /* what a generation needs in front opens the
					   * answer's turn (llama3); else it is a raw turn */
	unsigned shift_keeps_system : 1;  /* a context shift keeps the leading system
					   * turns (llama3) */
	unsigned answer_at_start : 1;     /* an answer's first piece drops its leading
					   * space, as a text's first does (chat templates) */
	unsigned takes_system : 1;        /* a system prompt has a place (chat templates) */
	unsigned exchange_starts;         /* 1 << role for the roles that begin the next
					   * exchange when a shift drops one (raw: all: one
					   * turn is an exchange) */
};

/* The rules of template tmpl (an unknown value: raw's). */
const struct chat_rules *chat_rules(int tmpl);

/* NULL if tokenizer t can encode conversations of template tmpl, else a
 * static reason (llama3 needs the Llama 3 control tokens). */
const char *chat_template_unusable(const struct tok *t, int tmpl);

/* The id that ends a turn under tmpl: llama3 <|eot_id|>, llama2 eos (the
 * model's EOS); -1 for raw (none) or when the vocabulary lacks it. */
int32_t chat_end_of_turn(const struct tok *t, int tmpl, int32_t eos);

/* 1 if text contains a Llama 2 control tag (llama2's guard, without a
 * vocabulary). */
int chat_has_tags(const char *text, size_t len);

/*
 * The control tags of template tmpl in len bytes of text (nothing is
 * refused for them: llama2 neutralises its tags, llama3 text stays text):
 * 1 if the text spells one (llama2: [INST], [/INST], <<SYS>>,
 * <</SYS>>; llama3: "<|name|>", a name of up to 128 bytes without '|', that
 * is a control token of t's vocabulary, as all of Llama 3's are),
 * with the first one copied into tag (cap bytes, NUL-terminated, cut to
 * fit); else 0 (raw: always 0).
 */
int chat_find_tag(const struct tok *t, int tmpl, const char *text, size_t len, char *tag,
		  size_t cap);

/*
 * Encode a whole dialog under tmpl (llama2 or llama3).
 * llama2: an optional leading system message, then user and assistant
 * messages alternating, starting with user; the result ends with the last
 * user turn open (ready to generate) if the dialog ends with a user
 * message.
 * llama3: any order of user, system and assistant messages (the template
 * checks none), then the generation prompt, always (the template adds it
 * unconditionally).
 * Returns the number of ids with *ids malloc'd, or -EINVAL (bad order, no
 * message, raw), -ENOTSUP (the vocabulary lacks the template's control tokens), -EPROTO (the
 * tokenizer failed), -ENOMEM.
 */
int chat_encode_dialog(const struct tok *t, int tmpl, const struct chat_msg *msgs, int n,
		       int32_t **ids);

/*
 * Llama 2's: encode one user turn for an ongoing session: BOS + "[INST] {sys}{u}
 * [/INST]" where sys is the <<SYS>> block when `system` is non-NULL (first
 * turn; tags in the text neutralised). Returns the number of ids with
 * *ids malloc'd, or -EPROTO, -ENOMEM.
 */
int chat_encode_user_turn(const struct tok *t, const char *system, const char *user,
			  int32_t **ids);

/* What a new turn's tokens depend on in the conversation it joins. */
struct chat_ctx {
	enum chat_template tmpl;
	int32_t bos, eos;        /* the model's ids */
	int n_tokens;            /* tokens so far (0: the turn opens the conversation) */
	int has_user_turn;       /* a user turn exists already */
	int last_role;           /* enum chat_role of the last turn; -1: no turn */
	int open_answer;         /* the last turn is an answer that did not end with
				  * the template's end of turn (chat_end_of_turn) */
	const char *system;      /* the conversation's system prompt (OpenSession's) */
	const char *next_system; /* a system turn waiting for the next user turn (llama2) */
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
 *    Meta's format;
 *  - llama3, any role: <|eot_id|> first when it closes an open answer;
 *    <|begin_of_text|> and the system prompt's message (c->system) first
 *    when it opens the conversation; then a user turn is its message and
 *    the generation prompt, a system turn its message, and an answer
 *    written by the client its text and <|eot_id|> after the generation
 *    prompt a user turn left (c->last_role CHAT_USER), else its whole
 *    message.
 * Returns the number of ids (*ids malloc'd, NULL when 0), or -ENOTSUP (the
 * vocabulary lacks the template's control tokens), -EPROTO (the tokenizer
 * failed), -ENOMEM.
 */
int chat_encode_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
		     const char *text, int32_t **ids);

/*
 * The tokens a generation needs in front of it in conversation c: raw and
 * llama2, BOS when the conversation is empty; llama3, the generation
 * prompt (after <|begin_of_text|> and the system prompt's message when the
 * conversation is empty) unless the last turn is a user turn (which ends
 * with it), an answer still open (the generation continues it) or a raw
 * turn. Returns the number of ids (*ids malloc'd, NULL when 0), or
 * -ENOTSUP, -EPROTO, -ENOMEM.
 */
int chat_encode_generation(const struct tok *t, const struct chat_ctx *c, int32_t **ids);

/*
 * The tokens a conversation's first turn takes after the turns before it
 * were dropped (context shift): a llama2 user turn with its text is encoded
 * again with the system prompt (c->system); a llama3 user or system turn
 * with its text is encoded again as the opening turn; any other turn, whose
 * tokens are old[0, n_old), gets BOS in front unless it starts with it.
 * Returns the number of ids (*ids malloc'd), 0 if the turn can stay as it
 * is, or -ENOTSUP, -EPROTO, -ENOMEM.
 */
int chat_encode_first_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
			   const char *text, const int32_t *old, int n_old, int32_t **ids);

/*
 * Where an answer's own tokens start in the ids of its turn (ids[0, n)):
 * after BOS and, llama3, the assistant header and its "\n\n" when the turn
 * opens with them (the template's framing a context shift keeps when it
 * slides the answer). 0..n.
 */
int chat_answer_start(const struct tok *t, int tmpl, const int32_t *ids, int n);
/*
 * The text of an answer the model generated, from the tokens of its turn
 * (ids[0, n)), as a Generate streamed it: the template's framing in front
 * (BOS; llama3, the assistant header and its "\n\n") skipped, control
 * tokens (the end of turn) giving no text, the first piece's leading space
 * dropped under a chat template (as the stream does), ids outside the
 * vocabulary skipped. Unlike the stream, a matched stop string is part of
 * the text (its tokens are in the turn). Returns the length with *text
 * malloc'd (NUL-terminated), or -ENOMEM.
 */
int chat_answer_text(const struct tok *t, int tmpl, const int32_t *ids, int n, char **text);

#endif
