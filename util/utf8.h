/*
 * util/utf8.h — UTF-8 validity as the project means it everywhere (wire
 * strings, tokenizer input, streamed text): no overlong forms, no
 * surrogates, nothing above U+10FFFF; a NUL byte is a valid character.
 */
#ifndef LLAMAD_UTIL_UTF8_H
#define LLAMAD_UTIL_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Total length of a UTF-8 sequence starting with lead, or 0 if lead cannot
 * start one (continuation bytes, C0/C1, F5..FF). */
static inline int utf8_seq_len(uint8_t lead)
{
	if (lead < 0x80)
		return 1;
	if (lead >= 0xc2 && lead <= 0xdf)
		return 2;
	if (lead >= 0xe0 && lead <= 0xef)
		return 3;
	if (lead >= 0xf0 && lead <= 0xf4)
		return 4;
	return 0;
}

/* 1 if b may be byte number idx (1-based after the lead) of a sequence
 * started by lead. The second byte's range excludes overlongs (E0, F0),
 * surrogates (ED) and code points above U+10FFFF (F4). */
static inline int utf8_cont_ok(uint8_t lead, int idx, uint8_t b)
{
	uint8_t lo = 0x80, hi = 0xbf;

	if (idx == 1) {
		if (lead == 0xe0)
			lo = 0xa0;
		else if (lead == 0xed)
			hi = 0x9f;
		else if (lead == 0xf0)
			lo = 0x90;
		else if (lead == 0xf4)
			hi = 0x8f;
	}
	return b >= lo && b <= hi;
}

/* Length of the longest prefix of s[0..len) that is valid, complete UTF-8. */
size_t utf8_valid_prefix(const char *s, size_t len);
/* 1 if s[0..len) is entirely valid UTF-8 (no overlongs, no surrogates). */
int utf8_valid(const char *s, size_t len);

#endif
