// Host loss under load: steady arrivals (RATE/s for DURATION_S) while one worker dies.
// k6 only makes the load; `thaw loadtest host-loss` kills the worker running the app's
// machine mid-run (the agent and its machines, with kill -9; or a command you give) and
// records when. Idempotent GETs must not fail: in-flight ones are retried, undelivered
// ones held and woken elsewhere.
import { hit, steadyScenario, thresholds, trendStats } from './lib/thaw.js';

export const options = {
  scenarios: { host_loss: steadyScenario() },
  thresholds: thresholds(),
  summaryTrendStats: trendStats,
};

export default function () {
  hit();
}
