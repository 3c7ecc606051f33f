/* gen_transformer.h: an N-layer model made of the block of examples/transformer_block.yaml, chained.
 *
 *   GenOpts o = gen_opts_default(24);   // the example's shapes and mesh
 *   o.data = 2, o.model = 4;            // mesh {data: 2, model: 4}
 *   size_t n;
 *   char *yaml = gen_transformer(&o, &n);
 *   ...
 *   free(yaml);
 *
 * Layer K's names are the example's prefixed with "lK." (l0.wq, l0.q, ...);
 * layer 0 reads the input x, layer K reads l(K-1).z, and the output is the
 * last layer's z.  Shardings are written where the example writes them. */
#ifndef SPMD_GEN_TRANSFORMER_H
#define SPMD_GEN_TRANSFORMER_H

#include <stddef.h>

typedef struct {
	int nlayer;        /* >= 1 */
	int data, model;   /* mesh {data: DATA, model: MODEL} */
	int batch, seq;    /* x is [batch, seq, dmodel] */
	int dmodel, heads, dhead, mlp;
} GenOpts;

/* The example's shapes and mesh: batch 4, seq 16, d_model 64, 4 heads of
 * 16, MLP 256, mesh {data: 2, model: 2}. */
GenOpts gen_opts_default(int nlayer);
/* The model's YAML text (malloc'd, NUL-terminated); its length in *len. */
char *gen_transformer(const GenOpts *o, size_t *len);
/* Ops in the model: 21 per layer. */
long gen_op_count(const GenOpts *o);

#endif
