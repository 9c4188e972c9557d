/*
 * kernels/cuda/candidates/plan.c — launch plans of the CUDA backend's layer
 * candidates
 * (plan.h). Plain C, built with or without nvcc: the backend executes these
 * plans, and tests/unit/test_cuplan.c checks and prints them on the CPU.
 */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/plan.h"

static const char *const cand_names[CU_N_CAND] = { "base", "fused", "persistent", "splitk" };

const char *cu_cand_name(enum cu_cand c)
{
	return (unsigned)c < CU_N_CAND ? cand_names[c] : "?";
}

int cu_cand_parse(const char *s)
{
	for (int i = 0; i < CU_N_CAND; i++)
		if (s && !strcmp(s, cand_names[i]))
			return i;
	return -1;
}

/* Until a GPU run has timed the candidates (tests/gpu/run.sh), every
 * dtype keeps the kernels that have run on one. */
static const int cand_fixed[CU_N_DTYPE] = {
	[KT_F32] = CU_CAND_BASE, [KT_F16] = CU_CAND_BASE, [KT_BF16] = CU_CAND_BASE,
	[KT_Q8_0] = CU_CAND_BASE, [KT_Q4_0] = CU_CAND_BASE, [KT_Q4_K] = CU_CAND_BASE,
	[KT_Q5_K] = CU_CAND_BASE, [KT_Q6_K] = CU_CAND_BASE,
};

void cu_cand_defaults(int table[CU_N_DTYPE])
{
	memcpy(table, cand_fixed, sizeof(cand_fixed));
}

int cu_cand_spec(const char *spec, int table[CU_N_DTYPE])
{
	int t[CU_N_DTYPE];
	memcpy(t, table, sizeof(t));
	char buf[256];
	if (!spec || strlen(spec) >= sizeof(buf))
		return -1;
	strcpy(buf, spec);
	int all = cu_cand_parse(buf);
	if (all >= 0) {
		for (int i = 0; i < CU_N_DTYPE; i++)
			table[i] = all;
		return 0;
	}
	char *save = NULL;
	for (char *it = strtok_r(buf, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(it, '=');
		if (!eq)
			return -1;
		*eq = 0;
		int d = -1, c = cu_cand_parse(eq + 1);
		for (int i = 0; i < CU_N_DTYPE; i++)
			if (!strcmp(it, kt_dtype_name((enum kt_dtype)i)))
				d = i;
		if (d < 0 || c < 0)
			return -1;
		t[d] = c;
	}
	memcpy(table, t, sizeof(t));
	return 0;
}

const char *cu_kind_name(enum cu_kind k)
{
	static const char *const n[CU_N_KIND] = {
		"rmsnorm", "quant_x", "gemv_qkv", "rope", "kv_store", "attention",
		"attn_combine", "gemv_add", "gemv_swiglu", "norm_qkv_rope_kv", "qkv_rope_kv",
		"norm_swiglu", "splitk_add", "layer",
	};
	return (unsigned)k < CU_N_KIND ? n[k] : "?";
}

static unsigned cdiv(size_t a, size_t b)
{
	return (unsigned)((a + b - 1) / b);
}

static struct cu_step *add(struct cu_plan *p, enum cu_kind k, int arg, unsigned grid,
			   unsigned block, double bytes)
{
	struct cu_step *s = &p->s[p->n++];
	memset(s, 0, sizeof(*s));
	s->kind = k;
	s->arg = arg;
	s->grid[0] = grid;
	s->grid[1] = s->grid[2] = 1;
	s->block = block;
	s->bytes = bytes;
	return s;
}

/* bytes of a rows x cols matrix of the shape's dtype */
static double wbytes(const struct cu_shape *sh, int rows, int cols)
{
	return (double)kt_row_bytes(sh->dt, (size_t)cols) * rows;
}

/* shared memory of activations staged for a product over cols: 8-bit
 * blocks with their scales and sums, or fp32 */
static size_t stage_bytes(const struct cu_shape *sh, int cols)
{
	return cu_stage_bytes(sh->qx ? XS_Q8 : XS_F32, sh->n_tok, cols, cols / 32);
}

/* activations read by a matrix-vector kernel: x once per block (from L2
 * after the first) is not counted; x and y once */
static double actbytes(const struct cu_shape *sh, int cols, int rows)
{
	return 4.0 * sh->n_tok * (cols + rows);
}

/* bytes of one K or V element of the shape's pool (q8_0: its code and its
 * share of a scale) */
static double kv_elem_bytes(const struct cu_shape *sh)
{
	int g = kt_kv_group_for(sh->hd);
	if (sh->kv_dt == KT_Q8_0)
		return 1.0 + 2.0 / (g > 0 ? g : 1);
	return sh->kv_dt == KT_F16 ? 2.0 : 4.0;
}

static void attention(struct cu_plan *p, const struct cu_shape *sh)
{
	int kv_dim = sh->n_kv_heads * sh->hd;
	int units = sh->single_rows ? sh->n_tok : sh->n_tiles;
	int split = cu_attn_split(units, sh->n_heads, sh->hd, sh->n_tok, sh->n_sm);
	double kvb = 2.0 * kv_elem_bytes(sh) * (double)sh->ctx * kv_dim * sh->n_tok;
	struct cu_step *s = add(p, CU_K_ATTN, 0, (unsigned)(units * (sh->single_rows ? sh->n_heads : 1)),
				128, kvb + 4.0 * sh->n_tok * sh->n_heads * sh->hd);
	if (!sh->single_rows)
		s->grid[1] = (unsigned)sh->n_heads;
	else  /* the decode kernels' query and per-warp partials */
		s->smem = cu_attn_decode_smem(sh->hd);
	s->grid[sh->single_rows ? 1 : 2] = (unsigned)split;
	s->splits = split;
	if (split > 1)
		add(p, CU_K_ATTN_COMBINE, 0, (unsigned)(sh->n_tok * sh->n_heads), 128,
		    4.0 * sh->n_tok * sh->n_heads * split * (sh->hd + 2));
}

static void quant(struct cu_plan *p, const struct cu_shape *sh, int arg, int cols)
{
	size_t nb = (size_t)sh->n_tok * cols / 32;
	add(p, CU_K_QUANT_X, arg, cdiv(nb, 8), 256, 4.0 * sh->n_tok * cols);
}

static void gemv(struct cu_plan *p, const struct cu_shape *sh, enum cu_kind k, int arg, int rows,
		 int cols, double wb)
{
	struct cu_step *s = add(p, k, arg, cdiv((size_t)rows, CU_GW), CU_GW * 32,
				wb + actbytes(sh, cols, rows));
	size_t sm = stage_bytes(sh, cols);
	s->smem = sm <= CU_SMEM_PLAIN && cols % 32 == 0 ? sm : 0;
}

static void splitk(struct cu_plan *p, const struct cu_shape *sh, int arg, int rows, int cols)
{
	int S = cu_splitk_parts(rows, cols, sh->n_sm);
	struct cu_step *s = add(p, CU_K_SPLITK_ADD, arg, cdiv((size_t)rows, CU_GW), CU_GW * 32,
				wbytes(sh, rows, cols) + actbytes(sh, cols, rows) +
				(S > 1 ? 8.0 * S * sh->n_tok * rows : 0));
	s->grid[1] = (unsigned)S;
	s->splits = S;
	size_t most = ((size_t)cols / 32 + S - 1) / S;  /* blocks of the widest part */
	s->smem = (size_t)sh->n_tok * most * 40;
}

/* RMSNorm into xb (arg 0: attention's, 1: the FFN's), then its 8-bit
 * quantization when the products take 8-bit activations */
static void norm_ops(struct cu_plan *p, const struct cu_shape *sh, int arg)
{
	add(p, CU_K_RMSNORM, arg, (unsigned)sh->n_tok, 256, 8.0 * sh->n_tok * sh->dim);
	if (sh->qx)
		quant(p, sh, 0, sh->dim);
}

/* gate/up + SwiGLU over xb, already normed */
static void swiglu_ops(struct cu_plan *p, const struct cu_shape *sh)
{
	gemv(p, sh, CU_K_GEMV_SWIGLU, 0, sh->ffn, sh->dim, 2 * wbytes(sh, sh->ffn, sh->dim));
}

/* x += o(att) (arg 0) or down(hb) (arg 1): split along K, or a plain
 * product after the input's 8-bit quantization */
static void add_out(struct cu_plan *p, const struct cu_shape *sh, int arg, int split_k)
{
	int D = sh->dim, cols = arg ? sh->ffn : sh->n_heads * sh->hd;
	if (split_k) {
		splitk(p, sh, arg, D, cols);
		return;
	}
	if (sh->qx)
		quant(p, sh, arg + 1, cols);
	gemv(p, sh, CU_K_GEMV_ADD, arg, D, cols, wbytes(sh, D, cols));
}

static void plan_base(struct cu_plan *p, const struct cu_shape *sh)
{
	int D = sh->dim, kv = sh->n_kv_heads * sh->hd, qd = sh->n_heads * sh->hd;
	norm_ops(p, sh, 0);
	gemv(p, sh, CU_K_GEMV_QKV, 0, qd + 2 * kv, D, wbytes(sh, qd + 2 * kv, D));
	add(p, CU_K_ROPE, 0, (unsigned)(sh->n_tok * (sh->n_heads + sh->n_kv_heads)),
	    sh->hd / 2 < 32 ? 32 : sh->hd / 2 > 256 ? 256 : (unsigned)sh->hd / 2,
	    8.0 * sh->n_tok * (qd + kv));
	add(p, CU_K_KV_STORE, 0, (unsigned)sh->n_tok, 256, 8.0 * sh->n_tok * kv);
	attention(p, sh);
	add_out(p, sh, 0, 0);
	norm_ops(p, sh, 1);
	swiglu_ops(p, sh);
	add_out(p, sh, 1, 0);
}

/* the norm fits in the product's staging: 8-bit blocks (made in the block)
 * or fp32 rows */
static int norm_fits(const struct cu_shape *sh)
{
	return stage_bytes(sh, sh->dim) <= CU_SMEM_DYN && sh->dim % 32 == 0;
}

/* the fused q/k/v (+ norm) and gate/up (+ norm) steps */
static void fused_qkv(struct cu_plan *p, const struct cu_shape *sh)
{
	int D = sh->dim, kv = sh->n_kv_heads * sh->hd, qd = sh->n_heads * sh->hd;
	int nf = norm_fits(sh);
	if (!nf)
		norm_ops(p, sh, 0);
	/* a warp per rotation pair: half as many warps as rows; from xb (the
	 * norm did not fit) x is read from global memory */
	int rows = sh->kv_dt == KT_Q8_0;  /* k and v as rows, stored next */
	struct cu_step *s = add(p, nf ? CU_K_NORM_QKV_ROPE_KV : CU_K_QKV_ROPE_KV, rows,
				cdiv((size_t)(qd + 2 * kv) / 2, CU_GW), CU_GW * 32,
				wbytes(sh, qd + 2 * kv, D) + actbytes(sh, D, qd + 2 * kv));
	s->smem = nf ? stage_bytes(sh, D) : 0;
	if (rows)
		add(p, CU_K_KV_STORE, 0, (unsigned)sh->n_tok, 256, 8.0 * sh->n_tok * kv);
}

static void fused_ffn_in(struct cu_plan *p, const struct cu_shape *sh)
{
	if (norm_fits(sh)) {
		gemv(p, sh, CU_K_NORM_SWIGLU, 0, sh->ffn, sh->dim, 2 * wbytes(sh, sh->ffn, sh->dim));
		return;
	}
	norm_ops(p, sh, 1);
	swiglu_ops(p, sh);
}

static void plan_fused(struct cu_plan *p, const struct cu_shape *sh, int split_k)
{
	fused_qkv(p, sh);
	attention(p, sh);
	add_out(p, sh, 0, split_k);
	fused_ffn_in(p, sh);
	add_out(p, sh, 1, split_k);
}

size_t cu_plan_persist_smem(const struct cu_shape *sh)
{
	int w = sh->dim > sh->ffn ? sh->dim : sh->ffn;
	if (sh->n_heads * sh->hd > w)
		w = sh->n_heads * sh->hd;
	return cu_persist_smem(w, sh->hd, sh->qx);
}

static int plan_persist(struct cu_plan *p, const struct cu_shape *sh)
{
	/* (its attention unit takes head_dim <= 128: 4 channels a lane; with
	 * a q8_0 pool its q/k/v phase could not quantize a group: plan.h) */
	if (sh->n_tok != 1 || !sh->single_rows || sh->persist_blocks <= 0 || sh->hd > 128 ||
	    sh->kv_dt == KT_Q8_0 ||
	    cu_plan_persist_smem(sh) > CU_SMEM_PERSIST || sh->dim % 32 || sh->ffn % 32 ||
	    (sh->n_heads * sh->hd) % 32)
		return 0;
	struct cu_plan tmp = { 0 };
	plan_fused(&tmp, sh, 0);
	int split = cu_attn_split(1, sh->n_heads, sh->hd, 1, sh->n_sm);
	struct cu_step *s = add(p, CU_K_LAYER, 0, (unsigned)sh->persist_blocks, CU_PW * 32,
				cu_plan_bytes(&tmp));
	s->smem = cu_plan_persist_smem(sh);
	s->splits = split;
	/* q/k/v | attention | [combine |] o | gate/up | down */
	s->syncs = split > 1 ? 5 : 4;
	return 1;
}

int cu_plan_layer(enum cu_cand want, const struct cu_shape *sh, struct cu_plan *p)
{
	memset(p, 0, sizeof(*p));
	if (sh->n_tok < 1 || sh->n_tok > CU_GEMV_MAX || sh->hd % 2 || sh->hd > 512)
		return -1;
	enum cu_cand c = want;
	if (c == CU_CAND_SPLITK && !sh->qx)
		c = CU_CAND_FUSED;
	if (c == CU_CAND_PERSIST && !plan_persist(p, sh))
		c = CU_CAND_FUSED;
	p->cand = c;
	switch (c) {
	case CU_CAND_BASE: plan_base(p, sh); break;
	case CU_CAND_FUSED: plan_fused(p, sh, 0); break;
	case CU_CAND_SPLITK: plan_fused(p, sh, 1); break;
	default: break;
	}
	return 0;
}

double cu_plan_bytes(const struct cu_plan *p)
{
	double b = 0;
	for (int i = 0; i < p->n; i++)
		b += p->s[i].bytes;
	return b;
}

char *cu_plan_format(const struct cu_plan *p, char *buf, size_t size)
{
	size_t o = 0;
	buf[0] = 0;
	for (int i = 0; i < p->n && o < size; i++) {
		const struct cu_step *s = &p->s[i];
		int w = snprintf(buf + o, size - o, "  %2d %-16s arg=%d grid=%ux%ux%u block=%u "
				 "smem=%zu bytes=%.0f%s", i, cu_kind_name(s->kind), s->arg, s->grid[0],
				 s->grid[1], s->grid[2], s->block, s->smem, s->bytes,
				 s->kind == CU_K_LAYER ? " (phases in one launch)" : "");
		if (w < 0)
			break;
		o += (size_t)w;
		if (o < size && (s->splits || s->syncs))
			o += (size_t)snprintf(buf + o, size - o, " splits=%d syncs=%d", s->splits,
					      s->syncs);
		if (o < size)
			o += (size_t)snprintf(buf + o, size - o, "\n");
	}
	return buf;
}
