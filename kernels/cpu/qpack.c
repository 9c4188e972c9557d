/*
 * kernels/cpu/qpack.c — quantized weights packed row-interleaved for the
 * 8-bit kernels (qpack.h says the layout; cpu_qpack_new at weight
 * placement, with the pool's threads).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/cpu/qpack.h"

static size_t u_bytes(enum kt_dtype dt)
{
	switch (dt) {
	case KT_Q8_0: return 512;
	case KT_Q5_K: return 256 + 64;
	case KT_Q6_K: return 256 + 128;
	default: return 256;
	}
}

static void st16(uint8_t *p, uint16_t v)
{
	memcpy(p, &v, 2);
}

/* K-quants: sub-block j of a row's block (codes q) into the pack as
 * sub-block b of lane `lane` of group g. */
static void pack_sub(const struct cpu_qpack *p, uint8_t *g, int lane, int b,
		     const struct kt_qcodes *q, int j)
{
	const uint8_t *u = q->u + QB * j;
	uint8_t *ur = g + (size_t)b * p->ub, *s = g + p->s_off + (size_t)b * 32;
	for (int c = 0; c < 4; c++)
		for (int i = 0; i < 4; i++)
			ur[64 * c + 4 * lane + i] =
				(uint8_t)((u[4 * c + i] & 15) | (u[16 + 4 * c + i] & 15) << 4);
	if (p->dt == KT_Q5_K) {
		for (int c = 0; c < 8; c++) {
			uint64_t m;
			memcpy(&m, ur + 256 + 8 * c, 8);
			for (int i = 0; i < 4; i++)
				m |= (uint64_t)((u[4 * c + i] >> 4) & 1) << (4 * lane + i);
			memcpy(ur + 256 + 8 * c, &m, 8);
		}
	}
	if (p->dt == KT_Q6_K) {
		for (int h = 0; h < 2; h++)
			for (int i = 0; i < 4; i++) {
				int v = 0;
				for (int c = 0; c < 4; c++)
					v |= ((u[16 * h + 4 * c + i] >> 4) & 3) << (2 * c);
				ur[256 + 64 * h + 4 * lane + i] = (uint8_t)v;
			}
	}
	switch (p->dt) {
	case KT_Q4_K:
	case KT_Q5_K:
		s[lane] = (uint8_t)q->sc[j];
		s[16 + lane] = (uint8_t)q->m[j];
		break;
	case KT_Q6_K:
		s[lane] = (uint8_t)(int8_t)q->sc[2 * j];
		s[16 + lane] = (uint8_t)(int8_t)q->sc[2 * j + 1];
		break;
	default: break;
	}
	if (j == 0 && h_bytes(p->dt)) {
		uint8_t *h = g + p->h_off + (size_t)(b / 8) * h_bytes(p->dt);
		st16(h + 2 * lane, q->d);
		if (p->dt != KT_Q6_K)
			st16(h + 32 + 2 * lane, q->dmin);
	}
}

struct pack_job {
	struct cpu_qpack *p;
	const struct kt_weight *w;
};

/* Q8_0 / Q4_0 rows: their blocks' bytes are already in chunk order (a
 * Q4_0 byte i holds codes i and i+16), so dwords are copied as they are,
 * Q8_0's offset by 128 per byte. Returns 1 if a Q8_0 code is -128. */
static int pack_row_fast(const struct cpu_qpack *p, uint8_t *gp, int lane, const uint8_t *row)
{
	size_t bb = kt_row_bytes(p->dt, QB);
	int nc = p->dt == KT_Q8_0 ? 8 : 4;
	uint32_t zero = 0;
	for (int b = 0; b < p->nb; b++) {
		const uint8_t *blk = row + (size_t)b * bb;
		uint8_t *ur = gp + (size_t)b * p->ub;
		for (int c = 0; c < nc; c++) {
			uint32_t v;
			memcpy(&v, blk + 2 + 4 * c, 4);
			if (p->dt == KT_Q8_0) {
				v ^= 0x80808080u;
				zero |= (v - 0x01010101u) & ~v & 0x80808080u;   /* a byte u = 0 */
			}
			memcpy(ur + 64 * c + 4 * lane, &v, 4);
		}
		memcpy(gp + p->s_off + (size_t)b * 32 + 2 * lane, blk, 2);
	}
	return zero != 0;
}

static void pack_worker(void *ctx, int ith, int nth)
{
	struct pack_job *j = ctx;
	struct cpu_qpack *p = j->p;
	int bw = (int)kt_block_weights(p->dt);
	size_t rb = kt_row_bytes(p->dt, (size_t)p->cols), bb = kt_row_bytes(p->dt, (size_t)bw);
	struct kt_qcodes q;
	int min = 0;
	for (int g = ith; g < p->n_groups; g += nth) {
		uint8_t *gp = p->data + (size_t)g * p->group_bytes;   /* zeroed by mmap */
		for (int lane = 0; lane < QG && g * QG + lane < p->rows; lane++) {
			const uint8_t *row = (const uint8_t *)j->w->data + (size_t)(g * QG + lane) * rb;
			if (p->dt == KT_Q8_0 || p->dt == KT_Q4_0) {
				min |= pack_row_fast(p, gp, lane, row);
				continue;
			}
			for (int blk = 0; blk < p->cols / bw; blk++) {
				kt_block_codes(p->dt, row + (size_t)blk * bb, &q);
				for (int s = 0; s < bw / QB; s++)
					pack_sub(p, gp, lane, blk * (bw / QB) + s, &q, s);
			}
		}
	}
	if (min)
		__atomic_store_n(&p->q8_min, 1, __ATOMIC_RELAXED);
}

/* p's shape for w: 0, or -EINVAL when w is not packable. */
static int geometry(struct cpu_qpack *p, const struct kt_weight *w)
{
	if (!kt_dtype_is_quant(w->dtype) || w->cols <= 0 || w->rows <= 0 ||
	    w->cols % (int)kt_block_weights(w->dtype))
		return -EINVAL;
	p->dt = w->dtype;
	p->rows = w->rows;
	p->cols = w->cols;
	p->nb = w->cols / QB;
	p->n_groups = (w->rows + QG - 1) / QG;
	p->ub = u_bytes(p->dt);
	p->s_off = (size_t)p->nb * p->ub;
	p->h_off = p->s_off + (size_t)p->nb * 32;
	p->group_bytes = (p->h_off + (size_t)(p->nb / 8) * h_bytes(p->dt) + 63) & ~(size_t)63;
	return 0;
}

size_t cpu_qpack_size(const struct kt_weight *w)
{
	struct cpu_qpack p = { 0 };
	return geometry(&p, w) ? 0 : cpu_qpack_bytes(&p);
}

int cpu_qpack_new(const struct kt_weight *w, struct tpool *pool, struct cpu_qpack **out)
{
	*out = NULL;
	struct cpu_qpack *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	if (geometry(p, w)) {
		free(p);
		return -EINVAL;
	}
	/* its own mapping: page-aligned, transparent huge pages where the
	 * system allows (fewer TLB misses on the streams) */
	void *m = mmap(NULL, cpu_qpack_bytes(p), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		free(p);
		return -ENOMEM;
	}
	madvise(m, cpu_qpack_bytes(p), MADV_HUGEPAGE);
	p->data = m;
	struct pack_job j = { p, w };
	if (pool)
		tpool_run(pool, pack_worker, &j, tpool_size(pool));
	else
		pack_worker(&j, 0, 1);
	*out = p;
	return 0;
}

void cpu_qpack_free(struct cpu_qpack *p)
{
	if (p) {
		munmap(p->data, cpu_qpack_bytes(p));
		free(p);
	}
}

size_t cpu_qpack_bytes(const struct cpu_qpack *p)
{
	return (size_t)p->n_groups * p->group_bytes;
}
