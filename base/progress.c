/* progress.c: a progress bar on stderr for long commands (progress.h). */
#include "progress.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base.h"

void progress_begin_on(Progress *p, const char *label, int64_t total, const char *unit, FILE *out, double delay)
{
	*p = (Progress){.label = label, .unit = unit ? unit : "", .total = total, .out = out, .delay = delay};
	p->t0 = now_seconds();
	p->last = p->t0 - PROGRESS_EVERY;
}

void progress_begin(Progress *p, const char *label, int64_t total, const char *unit)
{
	const char *env = getenv("SPMD_PROGRESS");
	bool on = isatty(fileno(stderr)) && !(env && strcmp(env, "0") == 0);
	progress_begin_on(p, label, total, unit, on ? stderr : NULL, PROGRESS_DELAY);
}

enum { BAR_W = 30 };

void progress_format(const Progress *p, double elapsed, char *buf, size_t n)
{
	size_t k = (size_t)snprintf(buf, n, "%s ", p->label);
	if (p->total > 0 && k < n) {
		int64_t done = p->done < p->total ? p->done : p->total;
		int fill = (int)(done * BAR_W / p->total);
		char bar[BAR_W + 1];
		for (int i = 0; i < BAR_W; i++)
			bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
		bar[BAR_W] = 0;
		k += (size_t)snprintf(buf + k, n - k, "[%s] %lld/%lld %s", bar, (long long)done, (long long)p->total, p->unit);
		if (done > 0 && done < p->total && k < n)
			snprintf(buf + k, n - k, ", %.0f s left", elapsed * (double)(p->total - done) / (double)done);
	} else if (k < n)
		snprintf(buf + k, n - k, "%lld %s", (long long)p->done, p->unit);
}

static void draw(Progress *p, double now)
{
	char buf[256];
	progress_format(p, now - p->t0, buf, sizeof buf);
	fprintf(p->out, "\r%s\x1b[K", buf);
	fflush(p->out);
	p->shown = true, p->last = now;
}

void progress_set(Progress *p, int64_t done)
{
	p->done = done;
	if (!p->out)
		return;
	double now = now_seconds();
	if (now - p->t0 >= p->delay && now - p->last >= PROGRESS_EVERY)
		draw(p, now);
}

void progress_clear(Progress *p)
{
	if (!p->out || !p->shown)
		return;
	fputs("\r\x1b[K", p->out);
	fflush(p->out);
	p->shown = false;
	p->last = 0; /* the next progress_set draws again */
}

void progress_end(Progress *p)
{
	progress_clear(p);
	p->out = NULL;
}
