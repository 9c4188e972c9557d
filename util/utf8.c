/*
 * util/utf8.c — see utf8.h.
 */
#include "util/utf8.h"

/*
 * utf8_valid_prefix — length of the longest prefix of s[0..len) made of
 * complete, valid UTF-8 characters (no overlongs, no surrogates, nothing
 * above U+10FFFF). A NUL byte counts as a valid character.
 */
size_t utf8_valid_prefix(const char *s, size_t len)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t i = 0;

	while (i < len) {
		int n = utf8_seq_len(u[i]);
		if (n == 0 || len - i < (size_t)n)
			break;
		int k;
		for (k = 1; k < n; k++)
			if (!utf8_cont_ok(u[i], k, u[i + k]))
				break;
		if (k < n)
			break;
		i += (size_t)n;
	}
	return i;
}

/*
 * utf8_valid — 1 if s[0..len) is entirely valid, complete UTF-8; else 0.
 */
int utf8_valid(const char *s, size_t len)
{
	return utf8_valid_prefix(s, len) == len;
}
