/* autodiff.h: reverse-mode automatic differentiation of a graph, appending the backward ops.
 *
 *   int *grad = xmalloc(sizeof(int) * g->values.n);
 *   if (autodiff(g, loss, grad, &d) == 0)
 *           use(grad[w]);    // the value holding d loss / d w, named "d%w"
 *   free(grad);
 *
 * The backward ops are appended to the graph after every forward op, in
 * reverse order of the forward ops; each forward op contributes one term per
 * operand that needs a gradient, and terms for one value are summed with
 * `add`.  Gradients are expressed with the ops of the op table (einsum for
 * einsum, elementwise ops, reduce_sum and broadcast_to for broadcasting, pad
 * for slice, slice for concat and pad, ...) plus a few ops made for the
 * purpose (greater, take_grad, conv2d_grad_input, conv2d_grad_filter).  The
 * rules are described in docs/training.md. */
#ifndef SPMD_AUTODIFF_H
#define SPMD_AUTODIFF_H

#include "../spmd/ir.h"

/* Append to g the ops computing the gradient of the sum of the elements of
 * value `loss` (a float value, usually a scalar) with respect to every
 * param.  grad (g->values.n entries, the count before the call) gets, per
 * value, the id of its gradient, or -1 where no gradient flows; every param
 * gets one, named "d%NAME" (a name no model can write).  A param that does
 * not reach the loss gets a warning at its position and a zero gradient.
 * 0, or -1 after reporting an error (an op on the path to the loss that has
 * no gradient rule, such as a collective). */
int autodiff(Graph *g, int loss, int *grad, Diag *d);

/* Does op kind k have a gradient rule? */
bool autodiff_has_rule(OpKind k);

#endif
