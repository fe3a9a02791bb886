// Wake herd: many cold apps at once. APP_HOSTS names them (comma-separated); REQUESTS
// GETs start together, VU i asking app i mod len(APP_HOSTS), so every app gets its own
// burst and every app's wake runs at the same time. `thaw loadtest wake-herd` creates the
// apps (from the target app's image) and deletes them afterwards.
//
//   k6 run -e APP_HOSTS=a.localhost,b.localhost -e REQUESTS=100 loadtests/k6/wake-herd.js
import exec from 'k6/execution';
import { config, hit, thresholds, trendStats } from './lib/thaw.js';

const hosts = config.hosts.length > 0 ? config.hosts : [config.host];

export const options = {
  scenarios: {
    wake_herd: {
      executor: 'per-vu-iterations',
      vus: Math.max(config.requests, hosts.length),
      iterations: 1,
      maxDuration: `${Math.max(60, config.durationS)}s`,
    },
  },
  thresholds: thresholds({ cold: true }),
  summaryTrendStats: trendStats,
};

export default function () {
  hit(hosts[(exec.vu.idInTest - 1) % hosts.length]);
}
