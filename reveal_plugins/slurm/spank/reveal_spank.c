/*
 * reveal_spank.c -- SPANK plugin of Reveal plugins.
 *
 * Registers --reveal[=off|on|live] for srun, sbatch and salloc (an unknown value is rejected
 * before the job is submitted), and in remote context (slurmstepd, root) tells the node agent
 * when each job step starts and ends -- the batch and extern steps included -- over the
 * agent's Unix socket (<spool>/agent.sock, one JSON object per line, see docs/internals.md).
 * If the agent is not listening yet (it is being started by the Prolog), the event is left as
 * a file in <spool>/pending/, which the agent reads when it comes up.  No failure of this
 * plugin ever fails a step: every remote callback returns 0.
 *
 * With hooks=DIR (the scripts of `reveal slurm install-hooks`) it also replaces the Prolog
 * and Epilog: slurm_spank_job_prolog registers the job with the agent and
 * slurm_spank_job_epilog closes it, in C, in a few milliseconds -- no interpreter start in
 * slurmd's critical path.  Only the slow parts run in Python, detached (own session) so slurmd
 * never waits for them: starting an agent that is not running (DIR/prolog) and the analysis
 * (DIR/epilog, told by REVEAL_SPANK_UNREGISTERED that the job is already closed).
 *
 * plugstack.conf:  optional /path/reveal_spank.so [spool=/var/spool/reveal] [default=on|off]
 *                  [timeout_ms=300] [hooks=/etc/slurm/reveal]
 * Build: reveal slurm build-spank  (gcc -shared -fPIC against the installed slurm/spank.h).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <pwd.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#include <slurm/spank.h>

SPANK_PLUGIN(reveal, 1);

#define MODE_UNSET (-1)
#define MODE_OFF 0
#define MODE_ON 1
#define MODE_LIVE 2
#define STEP_BATCH 0xfffffffbU
#define STEP_EXTERN 0xfffffffcU
#define STEP_INTERACTIVE 0xfffffffaU

static const char *mode_names[] = {"off", "on", "live"};
static int opt_mode = MODE_UNSET;     /* from --reveal */
static int default_mode = MODE_ON;    /* from plugstack.conf default= */
static char spool[PATH_MAX - 64] = "/var/spool/reveal";
static int timeout_ms = 300;
static char hooks_dir[PATH_MAX - 64] = "";
static char timing_file[PATH_MAX - 64] = "";   /* benchmarks: per-job hook wall times */
static int disabled = 0;             /* bad plugstack.conf arguments: do nothing, fail nothing */
static int step_recorded = 0;
static int have_exit = 0;
static int step_exit = 0;
static char step_name[32];
static uint32_t job_id;

static int parse_mode(const char *s)
{
	if (s == NULL || *s == '\0' || strcasecmp(s, "on") == 0)
		return MODE_ON;
	if (strcasecmp(s, "off") == 0)
		return MODE_OFF;
	if (strcasecmp(s, "live") == 0)
		return MODE_LIVE;
	return MODE_UNSET;
}

static int reveal_opt_cb(int val, const char *optarg, int remote)
{
	int m = parse_mode(optarg);

	(void) val;
	if (m == MODE_UNSET) {
		slurm_error("reveal: invalid value '%s' for --reveal (expected off, on or live)",
			    optarg);
		return -1;
	}
	opt_mode = m;
	(void) remote;
	return 0;
}

/* Registered from slurm_spank_init: the static spank_options[] table is not seen by sbatch
 * and salloc (allocator context) in Slurm 22.05, spank_option_register() is. */
static struct spank_option reveal_option = {
	"reveal", "[off|on|live]",
	"Reveal hardware telemetry of this job/step: on (default), off (not recorded), "
	"live (also detect anomalies while it runs).",
	2, 0, reveal_opt_cb
};

/* An absolute path, shorter than n, with no "." or ".." component and no empty file name. */
static int path_ok(const char *v, size_t n)
{
	const char *c;

	if (v[0] != '/' || strlen(v) >= n || v[strlen(v) - 1] == '/')
		return 0;
	for (c = v; *c; c++) {
		if (c[0] == '/' && c[1] == '.' && (c[2] == '/' || c[2] == '\0' ||
		    (c[2] == '.' && (c[3] == '/' || c[3] == '\0'))))
			return 0;
	}
	return 1;
}

/* Every bad argument is reported (not only the first); -1 if there was any. */
static int parse_args(int ac, char **av)
{
	int bad = 0;

	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "spool=", 6) == 0) {
			const char *v = av[i] + 6;
			if (v[0] != '/' || strlen(v) >= sizeof(spool) ||
			    strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
				      "0123456789/_.-+") != strlen(v)) {
				slurm_error("reveal: plugstack.conf argument '%s': spool must be an "
					    "absolute path of [A-Za-z0-9/_.-+] shorter than %zu", av[i],
					    sizeof(spool));
				bad = 1;
				continue;
			}
			snprintf(spool, sizeof(spool), "%s", v);
		} else if (strncmp(av[i], "default=", 8) == 0) {
			int m = parse_mode(av[i] + 8);
			if (m == MODE_UNSET) {
				slurm_error("reveal: plugstack.conf argument '%s': expected "
					    "default=off|on|live", av[i]);
				bad = 1;
				continue;
			}
			default_mode = m;
		} else if (strncmp(av[i], "hooks=", 6) == 0) {
			const char *v = av[i] + 6;
			if (v[0] != '/' || strlen(v) >= sizeof(hooks_dir)) {
				slurm_error("reveal: plugstack.conf argument '%s': hooks must be an "
					    "absolute directory", av[i]);
				bad = 1;
				continue;
			}
			snprintf(hooks_dir, sizeof(hooks_dir), "%s", v);
		} else if (strncmp(av[i], "timing=", 7) == 0) {
			const char *v = av[i] + 7;
			if (!path_ok(v, sizeof(timing_file))) {
				slurm_error("reveal: plugstack.conf argument '%s': timing must be an "
					    "absolute file path without '..' components, shorter than "
					    "%zu", av[i], sizeof(timing_file));
				bad = 1;
				continue;
			}
			snprintf(timing_file, sizeof(timing_file), "%s", v);
		} else if (strncmp(av[i], "timeout_ms=", 11) == 0) {
			int t = atoi(av[i] + 11);
			if (t < 10 || t > 10000) {
				slurm_error("reveal: plugstack.conf argument '%s': timeout_ms must be "
					    "between 10 and 10000", av[i]);
				bad = 1;
				continue;
			}
			timeout_ms = t;
		} else {
			slurm_error("reveal: unknown plugstack.conf argument '%s' (known: spool=, "
				    "default=, timeout_ms=, hooks=, timing=)", av[i]);
			bad = 1;
		}
	}
	return bad ? -1 : 0;
}

/* Write a request into <spool>/pending/ without following any symlink. */
static int queue_pending(const char *json)
{
	char dir[PATH_MAX], name[112], final[96];
	struct timeval tv;
	struct stat st;
	int dfd, fd;
	size_t n = strlen(json);

	snprintf(dir, sizeof(dir), "%s/pending", spool);
	/* Same mode as the agent's (docs/protocol.md): only root queues requests. */
	mkdir(dir, 0700);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return -1;
	if (fstat(dfd, &st) < 0 || st.st_uid != 0) {
		close(dfd);
		return -1;
	}
	gettimeofday(&tv, NULL);
	snprintf(final, sizeof(final), "%ld.%06ld-spank%ld.json", (long) tv.tv_sec,
		 (long) tv.tv_usec, (long) getpid());
	snprintf(name, sizeof(name), ".%s.tmp", final);
	fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		close(dfd);
		return -1;
	}
	if (write(fd, json, n) != (ssize_t) n) {
		close(fd);
		unlinkat(dfd, name, 0);
		close(dfd);
		return -1;
	}
	close(fd);
	if (renameat(dfd, name, dfd, final) < 0) {
		unlinkat(dfd, name, 0);
		close(dfd);
		return -1;
	}
	close(dfd);
	return 0;
}

/* Send one request; return 0 if the agent answered ok, 1 if it refused, -1 if unreachable,
 * AGENT_BUSY if its backlog was full at connect (or the request could not be written whole,
 * or it closed the connection unanswered: it did not take it, queue it), AGENT_SENT if the
 * whole request was written and the read timed out (it reached the agent: delivered, it is
 * still working on it; never queue it again).
 * reply (may be NULL) receives the reply line. */
#define AGENT_BUSY (-3)
#define AGENT_SENT (-2)

/* Milliseconds left until ``end`` (CLOCK_MONOTONIC), at least 0. */
static int left_ms(const struct timespec *end)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	long ms = (end->tv_sec - now.tv_sec) * 1000L + (end->tv_nsec - now.tv_nsec) / 1000000L;
	return ms > 0 ? (int) ms : 0;
}

/* Arm the socket's send and receive timeouts with what is left of the deadline: connect,
 * send and every read share one budget of tmo_ms, so a slow agent costs the hook tmo_ms at
 * most, not tmo_ms per phase.  Returns 0 when nothing is left. */
static int arm(int fd, const struct timespec *end)
{
	int ms = left_ms(end);
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	if (ms <= 0)
		return 0;
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return 1;
}

static int agent_send_t(const char *json, char *reply, size_t rlen, int tmo_ms)
{
	struct sockaddr_un addr;
	struct timespec end;
	char buf[1024];
	size_t got = 0, n = strlen(json);
	int fd;

	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += tmo_ms / 1000;
	end.tv_nsec += (long) (tmo_ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	if (snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/agent.sock", spool) >=
	    (int) sizeof(addr.sun_path))
		return -1;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	arm(fd, &end);
	if (connect(fd, (struct sockaddr *) &addr, sizeof(addr)) < 0) {
		int busy = errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT;
		close(fd);
		return busy ? AGENT_BUSY : -1;
	}
	/* send(MSG_NOSIGNAL), not write(): an agent that accepted and closed must give EPIPE,
	 * not a SIGPIPE that kills slurmstepd's helper. Partial sends are continued. */
	for (size_t off = 0; off < n;) {
		ssize_t w = arm(fd, &end) ? send(fd, json + off, n - off, MSG_NOSIGNAL) : -1;
		if (w <= 0) {
			close(fd);
			return AGENT_BUSY;
		}
		off += (size_t) w;
	}
	int closed = 0;      /* the agent closed without a reply: it did not take the request */
	while (got < sizeof(buf) - 1) {
		if (!arm(fd, &end))
			break;     /* the budget is spent: an agent still at work */
		ssize_t r = read(fd, buf + got, sizeof(buf) - 1 - got);
		if (r <= 0) {   /* a timeout (EAGAIN) is an agent still at work; EOF/reset not */
			closed = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
			break;
		}
		got += (size_t) r;
		if (memchr(buf, '\n', got))
			break;
	}
	close(fd);
	buf[got] = '\0';
	if (reply)
		snprintf(reply, rlen, "%s", buf);
	if (got == 0)
		return closed ? AGENT_BUSY : AGENT_SENT;
	return (strstr(buf, "\"ok\": true") || strstr(buf, "\"ok\":true")) ? 0 : 1;
}

static int agent_send(const char *json, char *reply, size_t rlen)
{
	return agent_send_t(json, reply, rlen, timeout_ms);
}

static void send_event(const char *event, const char *extra)
{
	char json[512], reply[1024];
	struct timeval tv;
	int rc;

	gettimeofday(&tv, NULL);
	snprintf(json, sizeof(json),
		 "{\"op\": \"event\", \"run_id\": \"slurm-%u\", \"event\": \"%s\", "
		 "\"t\": %ld.%06ld, \"step_id\": \"%s\", \"source\": \"spank\"%s}\n",
		 job_id, event, (long) tv.tv_sec, (long) tv.tv_usec, step_name, extra);
	rc = agent_send(json, reply, sizeof(reply));
	if (rc == 0)
		return;
	if (rc == AGENT_SENT) {
		slurm_debug("reveal: %s of step %u.%s delivered (no reply in time)", event, job_id,
			    step_name);
		return;
	}
	/* Agent still starting (Prolog queued the registration) or busy: queue behind it. */
	if (rc < 0 || (strcmp(event, "step_start") == 0 && strstr(reply, "not registered"))) {
		if (queue_pending(json) == 0) {
			slurm_debug("reveal: agent at %s/agent.sock not ready; %s of step %u.%s "
				    "queued", spool, event, job_id, step_name);
			return;
		}
	}
	slurm_info("reveal: %s of step %u.%s not recorded: %s", event, job_id, step_name,
		   rc < 0 ? "agent unreachable or busy" : reply);
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();

	/* Never -1: with a "required" plugstack.conf line that would refuse every srun, sbatch
	 * and salloc on the cluster over a typo.  The option is still registered, so job scripts
	 * using --reveal keep working while the plugin does nothing. */
	if (parse_args(ac, av) < 0) {
		slurm_error("reveal: plugin disabled: bad plugstack.conf arguments (see above); "
			    "jobs run without Reveal telemetry");
		disabled = 1;
	}
	if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE) {
		if (spank_option_register(sp, &reveal_option) != ESPANK_SUCCESS)
			slurm_error("reveal: cannot register the --reveal option");
	}
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	uint32_t step = 0;
	int mode;
	char extra[64];

	(void) ac; (void) av;
	if (spank_context() != S_CTX_REMOTE || disabled)
		return 0;
	mode = opt_mode == MODE_UNSET ? default_mode : opt_mode;
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS)
		return 0;
	if (step == STEP_BATCH)
		snprintf(step_name, sizeof(step_name), "batch");
	else if (step == STEP_EXTERN)
		snprintf(step_name, sizeof(step_name), "extern");
	else if (step == STEP_INTERACTIVE)
		snprintf(step_name, sizeof(step_name), "interactive");
	else
		snprintf(step_name, sizeof(step_name), "%u", step);
	if (mode == MODE_OFF) {
		slurm_debug("reveal: step %u.%s not recorded (--reveal=off)", job_id, step_name);
		return 0;
	}
	snprintf(extra, sizeof(extra), ", \"mode\": \"%s\"", mode_names[mode]);
	send_event("step_start", extra);
	step_recorded = 1;
	return 0;
}

int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	int status = 0, code;

	(void) ac; (void) av;
	if (spank_context() != S_CTX_REMOTE || !step_recorded)
		return 0;
	if (spank_get_item(sp, S_TASK_EXIT_STATUS, &status) != ESPANK_SUCCESS)
		return 0;
	code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	if (!have_exit || (step_exit == 0 && code != 0))
		step_exit = code;
	have_exit = 1;
	return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	char extra[64];

	(void) sp; (void) ac; (void) av;
	if (spank_context() != S_CTX_REMOTE || !step_recorded)
		return 0;
	if (have_exit)
		snprintf(extra, sizeof(extra), ", \"exit_code\": %d", step_exit);
	else
		snprintf(extra, sizeof(extra), ", \"exit_code\": null");
	send_event("step_end", extra);
	step_recorded = 0;
	return 0;
}

/* ---- job_prolog / job_epilog (S_CTX_JOB_SCRIPT, root, once per job per node) ------------ */

/* Seconds since this process started (10 ms resolution): what slurmd waits for. */
static double process_age(void)
{
	char buf[1024];
	double up = 0;
	unsigned long long start = 0;
	FILE *f = fopen("/proc/self/stat", "r");
	char *p;

	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f)) {
		fclose(f);
		return -1;
	}
	fclose(f);
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d "
			 "%*d %*d %*d %*d %llu", &start) != 1)
		return -1;
	f = fopen("/proc/uptime", "r");
	if (!f)
		return -1;
	if (fscanf(f, "%lf", &up) != 1)
		up = 0;
	fclose(f);
	return up - (double) start / (double) sysconf(_SC_CLK_TCK);
}

/* Append one line to timing= (benchmarks).  Written as root, so: the parent directory must be
 * root-owned and not group/other-writable (nobody else can swap the name), and the file is
 * opened relative to it with O_NOFOLLOW, mode 0600, and must be a regular file. */
static void record_timing(const char *hook, uint32_t jid)
{
	char dir[sizeof(timing_file)], line[96];
	const char *base;
	struct stat st;
	int dfd, fd, n;

	if (!timing_file[0])
		return;
	snprintf(dir, sizeof(dir), "%s", timing_file);
	base = strrchr(timing_file, '/') + 1;
	dir[base - timing_file - 1] = '\0';
	dfd = open(dir[0] ? dir : "/", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		slurm_error("reveal: timing=%s: cannot open its directory: %m", timing_file);
		return;
	}
	if (fstat(dfd, &st) < 0 || st.st_uid != 0 || (st.st_mode & 022)) {
		slurm_error("reveal: timing=%s: refused: its directory is owned by uid %u, mode "
			    "%04o (must be root-owned, not group/other-writable)", timing_file,
			    (unsigned) st.st_uid, (unsigned) (st.st_mode & 07777));
		close(dfd);
		return;
	}
	fd = openat(dfd, base, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK,
		    0600);
	close(dfd);
	if (fd < 0) {
		slurm_error("reveal: timing=%s: %m (symlinks are not followed)", timing_file);
		return;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		slurm_error("reveal: timing=%s: not a regular file; not written", timing_file);
		close(fd);
		return;
	}
	n = snprintf(line, sizeof(line), "%s %u %ld 0\n", hook, jid,
		     (long) (process_age() * 1e6));
	if (n > 0 && write(fd, line, (size_t) n) != n)
		slurm_error("reveal: timing=%s: write failed: %m", timing_file);
	close(fd);
}

/* Copy a value that goes into JSON; anything outside a safe set makes it empty. */
static void safe_copy(char *dst, size_t n, const char *src)
{
	size_t i;

	dst[0] = '\0';
	if (src == NULL)
		return;
	for (i = 0; src[i] && i < n - 1; i++) {
		unsigned char c = (unsigned char) src[i];
		if (!(isalnum(c) || c == '_' || c == '-' || c == '.' || c == ',' || c == '[' ||
		      c == ']' || c == '@' || c == '+')) {
			dst[0] = '\0';
			return;
		}
		dst[i] = (char) c;
	}
	dst[i] = '\0';
}

/* "0,1" -> "[0,1]"; entries that are not plain indices ("", "a", "GPU-<uuid>", over 6
 * digits) are skipped, so "0,,1" gives [0,1] and "," gives null: always valid JSON. */
/* ``"src"`` as a JSON string (quotes included) of at most n bytes: printable ASCII kept,
 * '"' and '\\' escaped, anything else (control characters, bytes of other encodings, which
 * could make the whole request invalid UTF-8) becomes '?'.  User strings (job names) pass
 * through here. */
static void json_str(char *dst, size_t n, const char *src, size_t max_in)
{
	size_t o = 0;

	if (n < 3) {
		if (n)
			dst[0] = '\0';
		return;
	}
	dst[o++] = '"';
	for (size_t i = 0; src && src[i] && i < max_in; i++) {
		unsigned char c = (unsigned char) src[i];
		int esc = c == '"' || c == '\\';
		if (o + (esc ? 2 : 1) + 2 > n)
			break;
		if (esc)
			dst[o++] = '\\';
		dst[o++] = (c >= 0x20 && c < 0x7f) ? (char) c : '?';
	}
	dst[o++] = '"';
	dst[o] = '\0';
}

/* Append `, "key": "<getenv(env)>"` to dst (length *len, size n) when env is set and not
 * empty: the Slurm fields the Python Prolog registers too (hooks.run_info). */
static void extra_env(char *dst, size_t n, size_t *len, const char *key, const char *env)
{
	const char *v = getenv(env);
	char val[520];

	if (v == NULL || v[0] == '\0')
		return;
	json_str(val, sizeof(val), v, 512);
	int w = snprintf(dst + *len, n - *len, ", \"%s\": %s", key, val);
	if (w > 0 && (size_t) w < n - *len)
		*len += (size_t) w;
	else
		dst[*len] = '\0';
}

/* `, "gpu_spec": {...}` as gpu_ids.spec_from_env builds it: the agent resolves it to NVML
 * devices (UUIDs, MIG ids, PCI order), which a bare index list cannot carry. */
static void gpu_spec_json(char *dst, size_t n)
{
	static const char *const keys[] = {"SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"};
	char val[1040];
	const char *jid = getenv("SLURM_JOB_ID");

	dst[0] = '\0';
	for (size_t k = 0; k < 2; k++) {
		const char *v = getenv(keys[k]);
		while (v && isspace((unsigned char) *v))
			v++;
		if (v == NULL || v[0] == '\0' || strcasecmp(v, "nodevfiles") == 0 ||
		    strcasecmp(v, "none") == 0)
			continue;
		char trimmed[1025];
		snprintf(trimmed, sizeof(trimmed), "%s", v);
		for (size_t e = strlen(trimmed); e > 0 && isspace((unsigned char) trimmed[e - 1]);)
			trimmed[--e] = '\0';
		json_str(val, sizeof(val), trimmed, 1024);
		snprintf(dst, n, ", \"gpu_spec\": {\"source\": \"%s\", \"value\": %s, "
			 "\"slurm\": %s}", keys[k], val, jid && jid[0] ? "true" : "false");
		return;
	}
}

static void gpu_list_json(char *dst, size_t n, const char *list)
{
	size_t len = 0;
	int count = 0;
	const char *p = list;

	dst[0] = '\0';
	while (p && *p) {
		const char *end = strchr(p, ',');
		size_t k = end ? (size_t) (end - p) : strlen(p), j;
		int ok = k > 0 && k <= 6;

		for (j = 0; ok && j < k; j++)
			ok = isdigit((unsigned char) p[j]);
		if (ok && len + k + 3 < n) {
			int w = snprintf(dst + len, n - len, "%s%d", count ? "," : "[",
					 atoi(p));   /* atoi: "007" -> 7, valid JSON */
			len += (size_t) w;
			count++;
		}
		p = end ? end + 1 : NULL;
	}
	if (count)
		snprintf(dst + len, n - len, "]");
	else
		snprintf(dst, n, "null");
}

static void node_name(char *dst, size_t n)
{
	char host[256] = "";
	const char *v = getenv("SLURMD_NODENAME");

	if (v == NULL || *v == '\0') {
		gethostname(host, sizeof(host) - 1);
		char *dot = strchr(host, '.');
		if (dot)
			*dot = '\0';
		v = host;
	}
	safe_copy(dst, n, v);
}

/* Close every descriptor from 3 up, however high the limit: slurmstepd may hold fds past 1024. */
static void close_from_3(void)
{
#ifdef SYS_close_range
	if (syscall(SYS_close_range, 3U, ~0U, 0U) == 0)
		return;
#endif
	long max = sysconf(_SC_OPEN_MAX);
	if (max < 0 || max > 1048576)
		max = 1048576;
	for (long i = 3; i < max; i++)
		close((int) i);
}

/* Run DIR/<hook> detached (own session, stdio on /dev/null); slurmd does not wait for it.
 * The environment is built before fork(): after fork in a threaded process only
 * async-signal-safe calls are allowed, and setenv() allocates. */
static void spawn_hook(const char *hook, const char *state)
{
	static const char *const names[] = {"REVEAL_SPANK_UNREGISTERED=", "REVEAL_SPANK_QUEUED=",
					    "REVEAL_SPANK_DETACHED="};
	char path[PATH_MAX], extra[3][160];
	char **envp;
	size_t nenv = 0, k = 0;
	pid_t pid;

	if (snprintf(path, sizeof(path), "%s/%s", hooks_dir, hook) >= (int) sizeof(path))
		return;
	int nextra = 0;
	if (state && strcmp(hook, "epilog") == 0)
		snprintf(extra[nextra++], sizeof(extra[0]), "REVEAL_SPANK_UNREGISTERED=%s", state);
	if (state && strcmp(hook, "prolog") == 0)
		snprintf(extra[nextra++], sizeof(extra[0]), "REVEAL_SPANK_QUEUED=%s", state);
	snprintf(extra[nextra++], sizeof(extra[0]), "REVEAL_SPANK_DETACHED=1");
	while (environ && environ[nenv])
		nenv++;
	envp = calloc(nenv + (size_t) nextra + 1, sizeof(char *));
	if (envp == NULL) {
		slurm_error("reveal: no memory to start %s", path);
		return;
	}
	for (size_t i = 0; i < nenv; i++) {   /* ours replace any inherited value */
		int ours = 0;
		for (size_t j = 0; j < sizeof(names) / sizeof(names[0]); j++)
			ours |= strncmp(environ[i], names[j], strlen(names[j])) == 0;
		if (!ours)
			envp[k++] = environ[i];
	}
	for (int j = 0; j < nextra; j++)
		envp[k++] = extra[j];
	envp[k] = NULL;
	pid = fork();
	if (pid < 0) {
		slurm_error("reveal: fork for %s failed: %m", path);
		free(envp);
		return;
	}
	if (pid == 0) {
		if (setsid() < 0 || fork() != 0)
			_exit(0);
		int fd = open("/dev/null", O_RDWR);
		if (fd >= 0) {
			dup2(fd, 0); dup2(fd, 1); dup2(fd, 2);
			if (fd > 2)
				close(fd);
		}
		close_from_3();
		char *argv[] = {path, NULL};
		execve(path, argv, envp);
		_exit(127);
	}
	free(envp);
	waitpid(pid, NULL, 0);
}

int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
	uint32_t jid = 0;
	uid_t uid = 0;
	gid_t gid = 0;
	char host[128], user[128], gpus[256], gpus_json[300], json[8192];
	char extra[3000], spec[1200];
	size_t elen = 0;
	char gid_json[16], user_json[132];
	char reply[1024];
	struct passwd pw, *pwp = NULL;
	char pwbuf[4096];
	int rc;

	/* slurm_spank_init is not called in job-script context: parse the arguments here. */
	if (parse_args(ac, av) < 0 || hooks_dir[0] == '\0')
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &jid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS) {
		slurm_error("reveal: job_prolog: no job id/uid; job not recorded");
		return 0;
	}
	if (spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
		gid = (gid_t) -1;
	node_name(host, sizeof(host));
	safe_copy(user, sizeof(user), getenv("SLURM_JOB_USER"));
	if (user[0] == '\0' && getpwuid_r(uid, &pw, pwbuf, sizeof(pwbuf), &pwp) == 0 && pwp)
		safe_copy(user, sizeof(user), pw.pw_name);
	safe_copy(gpus, sizeof(gpus), getenv("SLURM_JOB_GPUS"));
	if (gpus[0] == '\0')
		safe_copy(gpus, sizeof(gpus), getenv("CUDA_VISIBLE_DEVICES"));
	gpu_list_json(gpus_json, sizeof(gpus_json), gpus);
	extra[0] = '\0';
	extra_env(extra, sizeof(extra), &elen, "partition", "SLURM_JOB_PARTITION");
	extra_env(extra, sizeof(extra), &elen, "nodelist", "SLURM_JOB_NODELIST");
	extra_env(extra, sizeof(extra), &elen, "account", "SLURM_JOB_ACCOUNT");
	extra_env(extra, sizeof(extra), &elen, "job_name", "SLURM_JOB_NAME");
	extra_env(extra, sizeof(extra), &elen, "cluster", "SLURM_CLUSTER_NAME");
	extra_env(extra, sizeof(extra), &elen, "cpus_on_node", "SLURM_CPUS_ON_NODE");
	gpu_spec_json(spec, sizeof(spec));
	if (host[0] == '\0') {
		slurm_error("reveal: job_prolog: unusable node name; job %u not recorded", jid);
		return 0;
	}
	if (gid == (gid_t) -1)
		snprintf(gid_json, sizeof(gid_json), "null");
	else
		snprintf(gid_json, sizeof(gid_json), "%u", (unsigned) gid);
	if (user[0])
		snprintf(user_json, sizeof(user_json), "\"%s\"", user);
	else
		snprintf(user_json, sizeof(user_json), "null");
	if (snprintf(json, sizeof(json),
		     "{\"op\": \"register\", \"run\": {\"run_id\": \"slurm-%u\", "
		     "\"source\": \"slurm\", \"host\": \"%s\", \"job_id\": \"%u\", "
		     "\"run_dir\": \"%s/jobs/%u/%s\", \"user\": %s, \"uid\": %u, \"gid\": %s, "
		     "\"gpus\": %s, \"cgroup\": null, "
		     "\"extra\": {\"registered_by\": \"spank\"%s%s%s}}}\n",
		     jid, host, jid, spool, jid, host, user_json, (unsigned) uid, gid_json,
		     gpus_json, extra, default_mode == MODE_LIVE ? ", \"live\": true" : "", spec)
	    >= (int) sizeof(json)) {
		slurm_error("reveal: job_prolog: request too long; job %u not recorded", jid);
		return 0;
	}
	rc = agent_send(json, reply, sizeof(reply));
	if (rc > 0)
		slurm_error("reveal: agent refused job %u: %s", jid, reply);
	else if (rc == AGENT_SENT)
		slurm_info("reveal: registration of job %u delivered to the agent (no reply in "
			   "time)", jid);
	else if (rc < 0) {
		/* No agent, or busy at connect (nothing sent): queue the registration now, so
		 * that it precedes the step events, and let the Python prolog start an agent. */
		int queued = queue_pending(json) == 0;
		spawn_hook("prolog", queued ? "queued" : NULL);
	}
	record_timing("prolog", jid);
	return 0;
}

int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	uint32_t jid = 0;
	char json[256], reply[1024], ecbuf[32] = "null";
	const char *ec = getenv("SLURM_JOB_EXIT_CODE2");
	int rc;

	if (parse_args(ac, av) < 0 || hooks_dir[0] == '\0')
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &jid) != ESPANK_SUCCESS)
		return 0;
	if (ec && isdigit((unsigned char) ec[0]))
		snprintf(ecbuf, sizeof(ecbuf), "%d", atoi(ec));
	snprintf(json, sizeof(json),
		 "{\"op\": \"unregister\", \"run_id\": \"slurm-%u\", \"exit_code\": %s}\n", jid,
		 ecbuf);
	/* The agent flushes the last segment before it answers: allow it a little longer. */
	rc = agent_send_t(json, reply, sizeof(reply), timeout_ms * 2);
	spawn_hook("epilog", rc == 0 ? "ok" : rc == AGENT_SENT ? "sent" :
		   rc == AGENT_BUSY ? "busy" : rc < 0 ? "unreachable" :
		   strstr(reply, "not registered") ? "notreg" : "refused");
	record_timing("epilog", jid);
	return 0;
}
