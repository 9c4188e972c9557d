/*
 * generate/sampler.c — see sampler.h.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "generate/sampler.h"

void sampler_params_default(struct sampler_params *p)
{
	p->temperature = 0.8f;
	p->top_k = 40;
	p->top_p = 0.95f;
	p->min_p = 0.05f;
	p->repeat_penalty = 1.0f;
	p->penalty_last_n = 64;
	p->presence_penalty = 0.0f;
	p->frequency_penalty = 0.0f;
	p->seed = 0;
}

const char *sampler_params_check(const struct sampler_params *p)
{
	if (!(p->temperature >= 0 && p->temperature <= 100))
		return "temperature must be in [0, 100]";
	if (p->top_k < 0)
		return "top-k must be >= 0";
	if (!(p->top_p > 0 && p->top_p <= 1))
		return "top-p must be in (0, 1]";
	if (!(p->min_p >= 0 && p->min_p < 1))
		return "min-p must be in [0, 1)";
	if (!(p->repeat_penalty > 0 && p->repeat_penalty <= 10))
		return "repeat penalty must be in (0, 10]";
	if (p->penalty_last_n < -1)
		return "penalty window must be >= -1";
	if (!(fabsf(p->presence_penalty) <= 10) || !(fabsf(p->frequency_penalty) <= 10))
		return "presence/frequency penalties must be in [-10, 10]";
	return NULL;
}

int sampler_init(struct sampler *s, const struct sampler_params *p, int vocab)
{
	memset(s, 0, sizeof(*s));
	s->p = *p;
	s->vocab = vocab;
	s->rng = p->seed ^ 0x9e3779b97f4a7c15ull;
	s->cand = malloc((size_t)vocab * sizeof(*s->cand));
	s->count = calloc((size_t)vocab, sizeof(*s->count));
	if (!s->cand || !s->count) {
		sampler_done(s);
		return -ENOMEM;
	}
	return 0;
}

void sampler_done(struct sampler *s)
{
	free(s->cand);
	free(s->count);
	s->cand = NULL;
	s->count = NULL;
}

/* splitmix64 */
static uint64_t next_u64(struct sampler *s)
{
	uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

float sampler_uniform(struct sampler *s)
{
	return (float)(next_u64(s) >> 40) * (1.0f / 16777216.0f);
}

static void apply_penalties(struct sampler *s, float *logits, const int32_t *hist, int n)
{
	const struct sampler_params *p = &s->p;
	if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
	    p->frequency_penalty == 0.0f)
		return;
	if (p->penalty_last_n == 0 || n == 0)
		return;
	int w = p->penalty_last_n < 0 || p->penalty_last_n > n ? n : p->penalty_last_n;
	const int32_t *h = hist + (n - w);
	for (int i = 0; i < w; i++)
		if (h[i] >= 0 && h[i] < s->vocab)
			s->count[h[i]]++;
	for (int i = 0; i < w; i++) {
		int32_t t = h[i];
		if (t < 0 || t >= s->vocab || s->count[t] == 0)
			continue;
		float v = logits[t];
		if (p->repeat_penalty != 1.0f)
			v = v > 0 ? v / p->repeat_penalty : v * p->repeat_penalty;
		v -= (float)s->count[t] * p->frequency_penalty + p->presence_penalty;
		logits[t] = v;
		s->count[t] = 0;  /* each distinct token once; also resets the table */
	}
}

static int cmp_cand(const void *a, const void *b)
{
	const struct sampler_cand *x = a, *y = b;
	if (x->v != y->v)
		return x->v < y->v ? 1 : -1;
	return x->id < y->id ? -1 : (x->id > y->id);
}

/* Heap of candidates ordered so that the root is the last in cmp_cand's
 * order (the worst kept). */
static void heap_up(struct sampler_cand *h, int i)
{
	while (i > 0) {
		int p = (i - 1) / 2;
		if (cmp_cand(&h[i], &h[p]) <= 0)
			break;
		struct sampler_cand t = h[i];
		h[i] = h[p];
		h[p] = t;
		i = p;
	}
}

static void heap_down(struct sampler_cand *h, int n)
{
	int i = 0;
	for (;;) {
		int l = 2 * i + 1, r = l + 1, m = i;
		if (l < n && cmp_cand(&h[l], &h[m]) > 0)
			m = l;
		if (r < n && cmp_cand(&h[r], &h[m]) > 0)
			m = r;
		if (m == i)
			break;
		struct sampler_cand t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

int32_t sampler_sample(struct sampler *s, float *logits, const int32_t *history, int n_history)
{
	const struct sampler_params *p = &s->p;
	int V = s->vocab;
	apply_penalties(s, logits, history, n_history);
	if (p->temperature <= 0.0f) {
		int32_t best = 0;  /* NaN never wins unless all are NaN */
		for (int i = 1; i < V; i++)
			if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i])))
				best = i;
		return best;
	}
	int n = 0;
	float inv_t = 1.0f / p->temperature;
	if (p->top_k > 0 && p->top_k < V / 8) {
		/* the k best in the full sort's order, without sorting the whole
		 * vocabulary (128k entries for Llama 3): cand[0, k) is a heap
		 * whose root is the worst kept */
		int k = p->top_k;
		for (int i = 0; i < V; i++) {
			if (isnan(logits[i]))
				continue;
			struct sampler_cand c = { logits[i] * inv_t, i };
			if (n < k) {
				s->cand[n++] = c;
				heap_up(s->cand, n - 1);
			} else if (cmp_cand(&c, &s->cand[0]) < 0) {
				s->cand[0] = c;
				heap_down(s->cand, n);
			}
		}
	} else {
		for (int i = 0; i < V; i++) {
			if (isnan(logits[i]))
				continue;
			s->cand[n].v = logits[i] * inv_t;
			s->cand[n].id = i;
			n++;
		}
	}
	if (n == 0)
		return 0;
	qsort(s->cand, (size_t)n, sizeof(*s->cand), cmp_cand);
	if (isinf(s->cand[0].v) && s->cand[0].v > 0)
		return s->cand[0].id;  /* all the mass; exp(inf - inf) would be NaN */
	if (p->top_k > 0 && p->top_k < n)
		n = p->top_k;
	float mx = s->cand[0].v, sum = 0;
	for (int i = 0; i < n; i++) {
		s->cand[i].v = expf(s->cand[i].v - mx);
		sum += s->cand[i].v;
	}
	for (int i = 0; i < n; i++)
		s->cand[i].v /= sum;
	if (p->top_p < 1.0f) {
		float cum = 0;
		for (int i = 0; i < n; i++) {
			cum += s->cand[i].v;
			if (cum >= p->top_p) {
				n = i + 1;
				break;
			}
		}
	}
	if (p->min_p > 0.0f) {
		float lim = p->min_p * s->cand[0].v;
		int k = 1;
		while (k < n && s->cand[k].v >= lim)
			k++;
		n = k;
	}
	sum = 0;
	for (int i = 0; i < n; i++)
		sum += s->cand[i].v;
	float r = sampler_uniform(s) * sum, cum = 0;
	for (int i = 0; i < n; i++) {
		cum += s->cand[i].v;
		if (r < cum)
			return s->cand[i].id;
	}
	return s->cand[n - 1].id;
}
