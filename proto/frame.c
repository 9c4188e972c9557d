/*
 * proto/frame.c — see frame.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/frame.h"
#include "proto/names.h"

int frame_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *len)
{
	size_t n = protobuf_c_message_get_packed_size(msg);
	if (n > UINT32_MAX)
		return -EMSGSIZE;
	uint8_t *buf = malloc(FRAME_HDR + n);
	if (!buf)
		return -ENOMEM;
	frame_put_len(buf, (uint32_t)n);
	protobuf_c_message_pack(msg, buf + FRAME_HDR);
	*out = buf;
	*len = FRAME_HDR + n;
	return 0;
}

int frame_dial(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = strlen(path);
	if (len == 0)
		return -ENOENT;
	if (len >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, len + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno == EINTR)
			continue;
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

int frame_write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	while (len > 0) {
		ssize_t k = write(fd, p, len);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += k;
		len -= (size_t)k;
	}
	return 0;
}

int frame_send(int fd, const ProtobufCMessage *msg)
{
	uint8_t *buf;
	size_t len;
	int rc = frame_pack(msg, &buf, &len);
	if (rc)
		return rc;
	rc = frame_write_all(fd, buf, len);
	free(buf);
	return rc;
}

/* Read exactly len bytes. 0, 1 on end of stream before any byte, -EPROTO
 * on end of stream after some, or -errno. */
static int read_exact(int fd, uint8_t *p, size_t len)
{
	size_t got = 0;
	while (got < len) {
		ssize_t k = read(fd, p + got, len - got);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (k == 0)
			return got == 0 ? 1 : -EPROTO;
		got += (size_t)k;
	}
	return 0;
}

/* Read one frame from a blocking fd into *body (malloc'd, *len bytes).
 * Returns 0; -ECONNRESET on a clean end of stream before a header;
 * -EPROTO if the stream ends mid-frame; -EMSGSIZE if the length exceeds max;
 * another -errno on read errors. */
static int frame_recv(int fd, uint32_t max, uint8_t **body, uint32_t *len)
{
	uint8_t hdr[FRAME_HDR];
	int rc = read_exact(fd, hdr, FRAME_HDR);
	if (rc == 1)
		return -ECONNRESET;
	if (rc)
		return rc;
	uint32_t n = frame_get_len(hdr);
	if (n > max)
		return -EMSGSIZE;
	uint8_t *b = malloc(n ? n : 1);
	if (!b)
		return -ENOMEM;
	rc = read_exact(fd, b, n);
	if (rc) {
		free(b);
		return rc == 1 ? -EPROTO : rc;
	}
	*body = b;
	*len = n;
	return 0;
}

Llamad__Response *frame_recv_response(int fd, uint32_t max, int *err)
{
	uint8_t *body;
	uint32_t n;
	int rc = frame_recv(fd, max, &body, &n);
	if (rc) {
		*err = rc;
		return NULL;
	}
	Llamad__Response *r = llamad__response__unpack(NULL, n, body);
	free(body);
	if (!r)
		*err = -EBADMSG;
	return r;
}

/* Error names are written with spaces; these four read better longer. */
static const struct pb_enum_alias error_alias[] = {
	{ LLAMAD__ERROR_CODE__ERROR_UNSPECIFIED, "error" },
	{ LLAMAD__ERROR_CODE__UNKNOWN_OP, "unknown operation" },
	{ LLAMAD__ERROR_CODE__INTERNAL, "internal error" },
	{ LLAMAD__ERROR_CODE__STORAGE, "storage error" },
	{ 0, NULL },
};
static struct pb_enum_names error_names =
	PB_ENUM_NAMES(&llamad__error_code__descriptor, ' ', error_alias);

const char *frame_error_name(int code)
{
	const char *s = pb_enum_name(&error_names, code);
	return s ? s : "error";
}
