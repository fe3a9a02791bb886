// Steady warm load: RATE GETs per second for DURATION_S seconds (open model: arrivals do
// not wait for answers). `thaw loadtest steady` wakes the app before the run, so every
// request should be warm.
//
//   k6 run -e APP_HOST=hello.localhost -e RATE=50 -e DURATION_S=30 loadtests/k6/steady.js
import { hit, steadyScenario, thresholds, trendStats } from './lib/thaw.js';

export const options = {
  scenarios: { steady: steadyScenario() },
  thresholds: thresholds(),
  summaryTrendStats: trendStats,
};

export default function () {
  hit();
}
