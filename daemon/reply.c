/*
 * daemon/reply.c — see reply.h.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/reply.h"
#include "proto/frame.h"
#include "session/session.h"

static atomic_uint_fast64_t n_errors;

struct reply *reply_pack(uint64_t conn, const Llamad__Response *r)
{
	size_t n = llamad__response__get_packed_size(r);
	if (n + FRAME_HDR > REPLY_MAX) {
		char msg[160];
		snprintf(msg, sizeof(msg), "the reply would be %zu bytes, more than a reply may "
			 "take (%u): ask for less at a time", n + FRAME_HDR, REPLY_MAX);
		return reply_error(conn, r->id, LLAMAD__ERROR_CODE__TOO_LARGE, msg);
	}
	struct reply *o = malloc(sizeof(*o) + FRAME_HDR + n);
	if (!o)
		return NULL;
	o->next = NULL;
	o->conn = conn;
	o->id = r->id;
	o->terminal = r->body_case != LLAMAD__RESPONSE__BODY_TOKEN;
	o->len = FRAME_HDR + n;
	frame_put_len(o->data, (uint32_t)n);
	llamad__response__pack(r, o->data + FRAME_HDR);
	return o;
}

struct reply *reply_error(uint64_t conn, uint64_t id, int code, const char *msg)
{
	Llamad__Error err = LLAMAD__ERROR__INIT;
	PB_SET(&err, code, code);
	err.message = (char *)msg;
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_ERROR;
	r.error = &err;
	atomic_fetch_add(&n_errors, 1);
	return reply_pack(conn, &r);
}

int reply_code(int err)
{
	switch (-err) {
	case ENOENT: return LLAMAD__ERROR_CODE__UNKNOWN_SESSION;
	case EEXIST: return LLAMAD__ERROR_CODE__SESSION_EXISTS;
	case EBUSY: return LLAMAD__ERROR_CODE__BUSY;
	case EINVAL: return LLAMAD__ERROR_CODE__BAD_REQUEST;
	case EPERM: return LLAMAD__ERROR_CODE__REFUSED_TEXT;
	case EMSGSIZE: return LLAMAD__ERROR_CODE__CONTEXT_FULL;
	case E2BIG: return LLAMAD__ERROR_CODE__TOO_LARGE;
	case ECANCELED: return LLAMAD__ERROR_CODE__CANCELLED;
	case ESRCH: return LLAMAD__ERROR_CODE__UNKNOWN_REQUEST;
	case EACCES: return LLAMAD__ERROR_CODE__PERMISSION_DENIED;
	case EPROTONOSUPPORT: return LLAMAD__ERROR_CODE__BAD_VERSION;
	case ENOSYS: return LLAMAD__ERROR_CODE__UNKNOWN_OP;
	case ENOMEM: case ENOBUFS: case EUSERS:
		return LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED;
	case EDQUOT: return LLAMAD__ERROR_CODE__STORAGE_QUOTA;
	case EIO: case ESTALE: return LLAMAD__ERROR_CODE__STORAGE;
	case ESHUTDOWN: return LLAMAD__ERROR_CODE__SHUTTING_DOWN;
	default: return LLAMAD__ERROR_CODE__INTERNAL;
	}
}

uint64_t reply_errors(void)
{
	return atomic_load(&n_errors);
}

void reply_session_info(struct session *s, const struct info_env *env, Llamad__SessionInfo *i)
{
	llamad__session_info__init(i);
	i->session = s->id;
	PB_SET(i, tokens, sess_length(s));
	PB_SET(i, turns, s->loc == SESS_DISK ? s->disk_turns : (uint32_t)s->n_turns);
	PB_SET(i, location, s->loc);
	PB_SET(i, saved, !s->dirty && s->file_bytes > 0);
	PB_SET(i, file_bytes, s->file_bytes);
	PB_SET(i, cached_tokens, (uint32_t)s->n_cached);
	PB_SET(i, kv_blocks, (uint32_t)s->kv.n_blocks);
	PB_SET(i, kv_bytes, (uint64_t)s->kv.n_blocks * env->block_bytes);
	PB_SET(i, shared_blocks, env->shared_blocks);
	PB_SET(i, last_use_ms, s->last_use_ms);
	PB_SET(i, template_, s->tmpl);
	PB_SET(i, context_policy, s->policy);
	PB_SET(i, busy, s->busy);
	PB_SET(i, prefilled_tokens, s->prefilled);
	PB_SET(i, generated_tokens, s->generated);
	i->system = s->system;
	PB_SET(i, owner_uid, (uint32_t)s->uid);
	PB_SET(i, ephemeral, s->ephemeral);
	PB_SET(i, context_length, env->context_length);
}

struct reply *reply_info(uint64_t conn, uint64_t id, struct session *s,
			 const struct info_env *env, int created, const struct info_append *ap)
{
	Llamad__SessionInfo info;
	reply_session_info(s, env, &info);
	if (created >= 0) {
		PB_SET(&info, created, created);
	}
	if (ap) {
		PB_SET(&info, tokens_added, (uint32_t)ap->tokens_added);
		PB_SET(&info, computed_tokens, (uint32_t)ap->computed);
		PB_SET(&info, dropped_turns, (uint32_t)ap->dropped_turns);
	}
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_SESSION;
	r.session = &info;
	return reply_pack(conn, &r);
}
