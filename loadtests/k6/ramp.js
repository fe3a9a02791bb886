// Ramp up then down: concurrent clients (VUs, each sending its next GET as soon as the
// last answers) go from 1 to PEAK_CONCURRENCY over 40% of DURATION_S, stay there for 20%,
// and come back to 0 over the last 40%. thaw scales on requests in flight (the edge wakes
// more machines when they pass the app's soft limit), so concurrency is the load that
// machines follow up; once idle for the app's idle_timeout_s they stop. `thaw loadtest
// ramp` sets a small soft limit on the app for the run and keeps sampling machines after
// it until they have stopped.
//
//   k6 run -e APP_HOST=hello.localhost -e PEAK_CONCURRENCY=10 -e DURATION_S=60 \
//       loadtests/k6/ramp.js
import { sleep } from 'k6';
import { config, hit, thresholds, trendStats } from './lib/thaw.js';

const up = Math.max(1, Math.round(config.durationS * 0.4));
const top = Math.max(1, Math.round(config.durationS * 0.2));
const down = Math.max(1, config.durationS - up - top);

export const options = {
  scenarios: {
    ramp: {
      executor: 'ramping-vus',
      startVUs: 1,
      stages: [
        { target: config.peakConcurrency, duration: `${up}s` },
        { target: config.peakConcurrency, duration: `${top}s` },
        { target: 0, duration: `${down}s` },
      ],
      gracefulRampDown: '10s',
      gracefulStop: '30s',
    },
  },
  thresholds: thresholds(),
  summaryTrendStats: trendStats,
};

export default function () {
  hit();
  if (config.thinkMs > 0) sleep(config.thinkMs / 1000);
}
