/*
 * format/llama2c.c — see llama2c.h.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "format/llama2c.h"

static int32_t rd_i32(const unsigned char *p)
{
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			 (uint32_t)p[3] << 24);
}

int l2c_read_header(const uint8_t *data, size_t len, struct l2c_header *h)
{
	if (len >= 4 && memcmp(data, "24ka", 4) == 0)  /* uint32 0x616b3432 ("ak42") little-endian */
		return -ENOTSUP;
	if (len < L2C_HEADER_BYTES)
		return -EINVAL;
	int32_t v[7];
	memcpy(v, data, sizeof(v));
	*h = (struct l2c_header){ v[0], v[1], v[2], v[3], v[4], v[5], v[6] };
	return 0;
}

int l2c_tok_check(const void *data, size_t len, int *n_vocab)
{
	const unsigned char *p = data, *end = p + len;
	if (len < 4)
		return 0;
	int32_t max_len = rd_i32(p);
	if (max_len < 1 || max_len > 4096)
		return 0;
	p += 4;
	int n = 0;
	while (p < end) {
		if (end - p < 8)
			return 0;
		float score;
		memcpy(&score, p, 4);
		int32_t l = rd_i32(p + 4);
		if (!isfinite(score) || l < 0 || l > max_len || end - p - 8 < l)
			return 0;
		p += 8 + l;
		n++;
	}
	if (n < 3)
		return 0;
	if (n_vocab)
		*n_vocab = n;
	return 1;
}

const unsigned char *l2c_tok_piece(const unsigned char **p, size_t *n, float *score)
{
	const unsigned char *s = *p + 8;
	memcpy(score, *p, 4);
	*n = (size_t)rd_i32(*p + 4);
	*p = s + *n;
	return s;
}
