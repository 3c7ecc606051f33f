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
 * last layer's z.  Shardings are written where the example writes them
 * (plan GEN_EXAMPLE), or as o.plan says.  With vocab, the model is a
 * decoder-only language model: ids [batch, seq] look up an embedding
 * table, the layers follow, a final norm and an unembedding give logits
 * over the vocabulary, and with train the step minimises their cross
 * entropy against labels with Adam. */
#ifndef SPMD_GEN_TRANSFORMER_H
#define SPMD_GEN_TRANSFORMER_H

#include <stdbool.h>
#include <stddef.h>

/* What a plan annotates (bits of GenOpts.plan). */
enum {
	GEN_BATCH = 1, /* the batch over data: x (or ids and labels) [data, ...] */
	GEN_TP = 2,    /* Megatron tensor parallelism over model: heads and MLP columns, vocab-parallel tables */
	GEN_SP = 4,    /* sequence parallelism: the residual stream and the norms split by sequence over model */
	GEN_WUS = 8,   /* train: weight_update_sharding on */
	GEN_EXAMPLE = GEN_BATCH | GEN_TP,
};

typedef struct {
	int nlayer;        /* >= 1 */
	int data, model;   /* mesh {data: DATA, model: MODEL} */
	int batch, seq;    /* x is [batch, seq, dmodel] */
	int dmodel, heads, dhead, mlp;
	int plan;          /* GEN_* bits: which shardings are written */
	int vocab;         /* > 0: a decoder-only language model: ids -> embedding -> layers -> logits over vocab */
	bool train;        /* a train: section (Adam) minimising the cross entropy (needs vocab) */
} GenOpts;

/* The example's shapes, mesh and shardings: batch 4, seq 16, d_model 64,
 * 4 heads of 16, MLP 256, mesh {data: 2, model: 2}, forward only. */
GenOpts gen_opts_default(int nlayer);
/* The model's YAML text (malloc'd, NUL-terminated); its length in *len. */
char *gen_transformer(const GenOpts *o, size_t *len);
/* Ops in the model: 21 per layer. */
long gen_op_count(const GenOpts *o);

#endif
