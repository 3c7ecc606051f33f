/* stubs.c: weak placeholders so the tree links while modules are written; removed when they land. */
#include "ops.h"
#define W __attribute__((weak))
W int attr_axis(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_cast(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_collective(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_concat(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_conv2d(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_einsum(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_layer_norm(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_none(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_one_hot(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_pad(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_reduce(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_shape(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_slice(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int attr_transpose(struct LoadCtx *lc, const struct YNode *n, Op *op) { return -1; }
W int shape_all_gather(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_all_to_all(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_axis(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_binary(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_broadcast_to(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_cast(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_concat(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_conv2d(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_einsum(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_one_hot(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_pad(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_reduce(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_reduce_scatter(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_reshape(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_slice(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_take(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_transpose(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int shape_unary(const Graph *g, const Op *op, Shape *s, DType *t, Diag *d) { return -1; }
W int kern_binary(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_broadcast_to(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_cast(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_concat(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_conv2d(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_copy(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_einsum(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_layer_norm(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_log_softmax(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_one_hot(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_pad(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_reduce(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_slice(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_softmax(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_take(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_transpose(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W int kern_unary(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out) { return -1; }
W double graph_flops(const Graph *g) { return 0; }
