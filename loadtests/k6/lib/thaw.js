// What every thaw scenario shares: its parameters (environment variables, `k6 run -e
// NAME=VALUE` or the shell's), one GET through the edge with its metrics, and the SLO
// thresholds.
//
// A request the edge held for a wake answers with `Server-Timing: hold;dur=…, place;dur=…,
// pull;dur=…, boot;dur=…` (milliseconds); a warm one has no such header. So:
//   errors        Rate   any answer but 2xx (a refused connection or a timeout too)
//   warm_ms       Trend  duration of requests that were not held
//   cold_ms       Trend  duration of requests that were held (the whole cold request)
//   hold_ms       Trend  how long the edge held them (Server-Timing `hold`)
//   place_ms, pull_ms, boot_ms  Trends  the wake's phases, as Server-Timing says
//   cold_requests Counter
import http from 'k6/http';
import { Counter, Rate, Trend } from 'k6/metrics';

function number(name, fallback) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (Number.isNaN(value)) throw new Error(`${name} must be a number, not ${raw}`);
  return value;
}

function text(name, fallback) {
  const raw = __ENV[name];
  return raw === undefined || raw === '' ? fallback : raw;
}

export const config = {
  baseUrl: text('BASE_URL', 'http://127.0.0.1:8080').replace(/\/+$/, ''),
  host: text('APP_HOST', 'hello.localhost'),
  // wake herd: the Host names of the cold apps, comma-separated
  hosts: text('APP_HOSTS', '').split(',').map((h) => h.trim()).filter((h) => h),
  path: text('URL_PATH', '/'),
  requests: number('REQUESTS', 200),
  durationS: number('DURATION_S', 30),
  rate: number('RATE', 50),
  peakConcurrency: number('PEAK_CONCURRENCY', 10),
  thinkMs: number('THINK_MS', 0),
  maxVus: number('MAX_VUS', 200),
  timeout: text('REQUEST_TIMEOUT', '60s'),
  // the SLOs
  maxErrorRate: number('MAX_ERROR_RATE', 0),
  warmP99Ms: number('WARM_P99_MS', 1000),
  holdP99Ms: number('HOLD_P99_MS', 5000),
  coldP99Ms: number('COLD_P99_MS', 6000),
};

export const errors = new Rate('errors');
export const warmMs = new Trend('warm_ms', true);
export const coldMs = new Trend('cold_ms', true);
export const holdMs = new Trend('hold_ms', true);
export const placeMs = new Trend('place_ms', true);
export const pullMs = new Trend('pull_ms', true);
export const bootMs = new Trend('boot_ms', true);
export const coldRequests = new Counter('cold_requests');

// `hold;dur=12.5, place;dur=3.0` → {hold: 12.5, place: 3.0}
export function serverTiming(header) {
  const phases = {};
  for (const part of (header || '').split(',')) {
    const [name, ...params] = part.trim().split(';');
    const dur = params.map((p) => p.trim()).find((p) => p.startsWith('dur='));
    if (name && dur) phases[name.trim()] = Number(dur.slice(4));
  }
  return phases;
}

// One GET of `path` for `host` through the edge, with its metrics.
export function hit(host = config.host, path = config.path) {
  const response = http.get(`${config.baseUrl}${path}`, {
    headers: { Host: host },
    timeout: config.timeout,
    tags: { app: host },
  });
  errors.add(response.status < 200 || response.status > 299, { app: host });
  const phases = serverTiming(response.headers['Server-Timing']);
  if (phases.hold === undefined) {
    warmMs.add(response.timings.duration, { app: host });
  } else {
    coldRequests.add(1, { app: host });
    coldMs.add(response.timings.duration, { app: host });
    holdMs.add(phases.hold, { app: host });
    if (phases.place !== undefined) placeMs.add(phases.place, { app: host });
    if (phases.pull !== undefined) pullMs.add(phases.pull, { app: host });
    if (phases.boot !== undefined) bootMs.add(phases.boot, { app: host });
  }
  return response;
}

// The SLOs as k6 thresholds: a run that crosses one exits 99. `cold` adds "at least one
// request was cold" — a cold scenario whose app was warm measured nothing.
export function thresholds({ cold = false } = {}) {
  const slo = {
    errors: [`rate<=${config.maxErrorRate}`],
    warm_ms: [`p(99)<${config.warmP99Ms}`],
    hold_ms: [`p(99)<${config.holdP99Ms}`],
    cold_ms: [`p(99)<${config.coldP99Ms}`],
  };
  if (cold) slo.cold_requests = ['count>0'];
  return slo;
}

// Steady arrivals at `config.rate` per second for `config.durationS`.
export function steadyScenario() {
  return {
    executor: 'constant-arrival-rate',
    rate: config.rate,
    timeUnit: '1s',
    duration: `${config.durationS}s`,
    preAllocatedVUs: Math.min(config.maxVus, Math.max(5, Math.ceil(config.rate / 5))),
    maxVUs: config.maxVus,
    gracefulStop: '30s',
  };
}

export const trendStats = ['avg', 'min', 'med', 'p(95)', 'p(99)', 'max', 'count'];
