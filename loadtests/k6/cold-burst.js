// Cold burst: REQUESTS GETs to a sleeping app at once (one per VU, all VUs started
// together). The edge holds them, wakes the app once (sized by the burst) and releases
// them as machines come up. `thaw loadtest cold-burst` stops the app's machines first.
//
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e APP_HOST=hello.localhost -e REQUESTS=200 \
//       loadtests/k6/cold-burst.js
import { config, hit, thresholds, trendStats } from './lib/thaw.js';

export const options = {
  scenarios: {
    cold_burst: {
      executor: 'per-vu-iterations',
      vus: config.requests,
      iterations: 1,
      maxDuration: `${Math.max(60, config.durationS)}s`,
    },
  },
  thresholds: thresholds({ cold: true }),
  summaryTrendStats: trendStats,
};

export default function () {
  hit();
}
