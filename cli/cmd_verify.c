/* cmd_verify.c: `spmd verify DIR` — do the per-device programs' collectives match across their groups? */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "../spmd/load.h"
#include "../partitioner/verify.h"

enum { O_JSON, NVERIFY_OPTS };

static const CliOpt verify_opts[NVERIFY_OPTS] = {
	[O_JSON] = {"json", NULL, "print the outcome as JSON on stdout (the problem, if any, also on stderr)"},
};

static const char verify_desc[] =
	"Check the per-device programs that 'spmd partition MODEL.yaml --per-device DIR'\n"
	"wrote.  Every device runs its collectives in program order, each waiting for\n"
	"its replica group; the check plays that out and requires the members of each\n"
	"group to reach the same collectives in the same order, with the same kind,\n"
	"axes, reduction, dims, buffer shape and result, and permute partners that\n"
	"pair up.  Exit status 0: they match, so the programs cannot deadlock or\n"
	"exchange mismatched buffers; 1: a device would wait forever or exchange a\n"
	"mismatched buffer (the message names the device and the collective); 2: DIR\n"
	"is not a directory of one program's per-device files.  docs/verify.md.";

/* One device_N.yaml. */
typedef struct {
	long dev;   /* N */
	char *path;
	Graph g;
	bool ok;    /* loaded, and a per-device program of device N */
} DevFile;

typedef struct {
	const char *dir;
	VEC(DevFile) f; /* sorted by N */
	int ndev;       /* the mesh's devices */
	const Graph **prog; /* ndev entries, NULL where no file */
} DevDir;

/* device_N.yaml (N without leading zeros): 1 and *dev = N; a leftover of an
 * interrupted write (device_N.yaml.tmp.PID): 0; anything else: -1. */
static int device_file(const char *name, long *dev)
{
	const char *p = name + 7;
	char *end;
	if (strncmp(name, "device_", 7) != 0 || *p < '0' || *p > '9')
		return -1;
	*dev = strtol(p, &end, 10);
	if (strncmp(end, ".yaml", 5) != 0)
		return -1;
	if (end[5] == 0)
		return (p[0] != '0' || end == p + 1) && end - p < 9 ? 1 : -1;
	return strncmp(end + 5, ".tmp.", 5) == 0 ? 0 : -1;
}

static int by_device(const void *a, const void *b)
{
	long x = ((const DevFile *)a)->dev, y = ((const DevFile *)b)->dev;
	return (x > y) - (x < y);
}

/* The device_N.yaml files of dd->dir, sorted.  0, or -1 after reporting. */
static int scan_dir(DevDir *dd, Diag *d)
{
	DIR *dp = opendir(dd->dir);
	if (!dp) {
		diag_usage(d, "expected a directory of per-device programs (spmd partition --per-device DIR), found '%s' (%s)",
		           dd->dir, strerror(errno));
		return -1;
	}
	struct dirent *de;
	int rc = 0;
	while ((de = readdir(dp))) {
		long dev;
		const char *name = de->d_name;
		int kind = strcmp(name, ".") && strcmp(name, "..") ? device_file(name, &dev) : 0;
		if (kind < 0 && rc == 0)
			diag_usage(d, "expected only device_N.yaml files in %s (spmd partition --per-device), found '%s'",
			           dd->dir, name), rc = -1;
		if (kind <= 0)
			continue;
		size_t len = strlen(dd->dir) + strlen(name) + 2;
		DevFile f = {.dev = dev, .path = xmalloc(len)};
		bool slash = dd->dir[0] && dd->dir[strlen(dd->dir) - 1] == '/';
		snprintf(f.path, len, "%s%s%s", dd->dir, slash ? "" : "/", name);
		vec_push(&dd->f, f);
	}
	closedir(dp);
	if (rc == 0 && dd->f.n == 0)
		diag_usage(d, "expected device_N.yaml files in %s (spmd partition --per-device), found none", dd->dir), rc = -1;
	if (dd->f.n)
		qsort(dd->f.a, (size_t)dd->f.n, sizeof *dd->f.a, by_device);
	return rc;
}

/* Load f; it must be device N's program.  0, or -1 after reporting. */
static int load_file(DevFile *f, Diag *d)
{
	LoadKind kind;
	Pos top = {f->path, 0, 0};
	if (program_load(&f->g, f->path, &kind, d) != 0)
		return -1;
	if (!kind.spmd)
		diag_error(d, top, "expected a per-device program (spmd: true, device: %ld; spmd partition --per-device), found a model",
		           f->dev);
	else if (kind.device < 0)
		diag_error(d, top, "expected a per-device program (device: %ld), found the program every device runs, without device: (spmd partition -o)",
		           f->dev);
	else if (kind.device != f->dev)
		diag_error(d, top, "expected device: %ld, as the file's name says, found device: %d", f->dev, kind.device);
	return kind.spmd && kind.device == f->dev ? 0 : -1;
}

static bool same_mesh(const Mesh *a, const Mesh *b)
{
	if (a->naxes != b->naxes || a->ndev != b->ndev)
		return false;
	for (int i = 0; i < a->naxes; i++)
		if (strcmp(a->name[i], b->name[i]) != 0 || a->size[i] != b->size[i])
			return false;
	for (int p = 0; p < a->ndev; p++)
		if ((a->devices ? a->devices[p] : p) != (b->devices ? b->devices[p] : p))
			return false;
	return true;
}

/* "mlp on mesh data=2,model=4" */
static void program_text(const Graph *g, char *buf, size_t n)
{
	char mesh[128] = "none";
	if (g->mesh.naxes)
		mesh_format(&g->mesh, mesh, sizeof mesh);
	if (g->mesh.devices)
		snprintf(mesh + strlen(mesh), sizeof mesh - strlen(mesh), " (with a device order)");
	snprintf(buf, n, "%s on mesh %s", g->name ? g->name : "(unnamed)", mesh);
}

/* Every loaded file must be of one program: the first's name and mesh.  0 or -1. */
static int check_same(DevDir *dd, Diag *d)
{
	const DevFile *ref = NULL;
	int rc = 0;
	for (int i = 0; i < dd->f.n && !ref; i++)
		ref = dd->f.a[i].ok ? &dd->f.a[i] : NULL;
	for (int i = 0; ref && i < dd->f.n; i++) {
		DevFile *f = &dd->f.a[i];
		const char *a = ref->g.name ? ref->g.name : "", *b = f->g.name ? f->g.name : "";
		if (!f->ok || (strcmp(a, b) == 0 && same_mesh(&ref->g.mesh, &f->g.mesh)))
			continue;
		char want[256], got[256];
		program_text(&ref->g, want, sizeof want), program_text(&f->g, got, sizeof got);
		diag_error(d, (Pos){f->path, 0, 0}, "expected a file of the program in %s, %s, found one of %s", ref->path,
		           want, got);
		f->ok = false, rc = -1;
	}
	if (ref)
		dd->ndev = ref->g.mesh.ndev;
	return ref ? rc : -1;
}

/* Read dd->dir: every file a per-device program of one program.  0, or -1. */
static int load_dir(DevDir *dd, Diag *d)
{
	if (scan_dir(dd, d) != 0)
		return -1;
	int rc = 0;
	for (int i = 0; i < dd->f.n; i++) {
		DevFile *f = &dd->f.a[i];
		f->ok = load_file(f, d) == 0;
		rc |= f->ok ? 0 : -1;
	}
	if (check_same(dd, d) != 0 || rc != 0)
		return -1;
	dd->prog = xcalloc((size_t)dd->ndev, sizeof *dd->prog);
	for (int i = 0; i < dd->f.n; i++)
		dd->prog[dd->f.a[i].dev] = &dd->f.a[i].g; /* dev < ndev: the loader checked device: N */
	return 0;
}

static void dir_free(DevDir *dd)
{
	for (int i = 0; i < dd->f.n; i++)
		free(dd->f.a[i].path), graph_free(&dd->f.a[i].g);
	vec_free(&dd->f);
	free(dd->prog);
}

static void print_json(const DevDir *dd, const VerifyResult *r)
{
	json_t *o = json_object(), *p = json_null();
	json_object_set_new(o, "dir", json_string(dd->dir));
	json_object_set_new(o, "ok", json_boolean(r->ok));
	json_object_set_new(o, "devices", json_integer(r->ndev));
	json_object_set_new(o, "collectives", json_integer(r->ncoll));
	json_object_set_new(o, "group_collectives", json_integer(r->ngroup));
	if (!r->ok) {
		const VerifyProblem *q = &r->problem;
		p = json_object();
		json_object_set_new(p, "device", json_integer(q->device));
		json_object_set_new(p, "collective", q->index ? json_integer(q->index) : json_null());
		json_object_set_new(p, "op", q->op ? json_string(q->op) : json_null());
		json_object_set_new(p, "value", q->value ? json_string(q->value) : json_null());
		json_object_set_new(p, "file", q->pos.file ? json_string(q->pos.file) : json_null());
		json_object_set_new(p, "line", json_integer(q->pos.line));
		json_object_set_new(p, "col", json_integer(q->pos.col));
		json_object_set_new(p, "message", json_string(q->msg));
	}
	json_object_set_new(o, "problem", p);
	json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	fputc('\n', stdout);
	json_decref(o);
}

static int verify_dir(const char *dir, bool json)
{
	DevDir dd = {.dir = dir};
	Diag d;
	diag_init(&d);
	if (load_dir(&dd, &d) != 0) {
		dir_free(&dd);
		return 2;
	}
	VerifyResult r;
	verify_devices(dd.prog, dd.ndev, &r);
	if (!r.ok && !r.problem.pos.file) { /* a device without a file: name the file it lacks */
		size_t len = strlen(dir) + 32;
		char *path = arena_alloc(&dd.f.a[0].g.arena, len);
		snprintf(path, len, "%s%sdevice_%d.yaml", dir, dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/",
		         r.problem.device);
		r.problem.pos.file = path;
	}
	if (json)
		print_json(&dd, &r);
	else if (r.ok)
		printf("%s: ok: %d device%s, %lld collective%s, matched in %lld group operation%s\n", dir, r.ndev,
		       r.ndev == 1 ? "" : "s", (long long)r.ncoll, r.ncoll == 1 ? "" : "s", (long long)r.ngroup,
		       r.ngroup == 1 ? "" : "s");
	verify_report(&r, &d);
	dir_free(&dd);
	return r.ok ? 0 : 1;
}

int cmd_verify(int argc, char **argv)
{
	CliParse p;
	if (cli_parse("verify", argc, argv, verify_opts, NVERIFY_OPTS, &p) != 0)
		return 2;
	int rc = 0, npos = 0;
	const char *dir = NULL;
	for (int i = 0; i < p.args.n; i++)
		if (p.args.a[i].opt == -1)
			dir = p.args.a[i].value, npos++;
	if (p.help)
		cli_help(stdout, "verify", "DIR [--json]", verify_desc, verify_opts, NVERIFY_OPTS);
	else if (npos != 1) {
		fprintf(stderr, "spmd verify: error: expected one DIR (from spmd partition --per-device DIR), found %d (see spmd verify --help)\n",
		        npos);
		rc = 2;
	} else
		rc = verify_dir(dir, cli_flag(&p, O_JSON));
	cli_free(&p);
	return rc;
}
