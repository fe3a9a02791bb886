// Deploy under load: steady arrivals (RATE/s for DURATION_S) while a new release rolls
// out. k6 only makes the load; `thaw loadtest deploy` triggers the release mid-run (a
// PATCH of the app's env, or --deploy-image) and records when. The SLO is unchanged: no
// request may fail while machines are replaced.
import { hit, steadyScenario, thresholds, trendStats } from './lib/thaw.js';

export const options = {
  scenarios: { deploy: steadyScenario() },
  thresholds: thresholds(),
  summaryTrendStats: trendStats,
};

export default function () {
  hit();
}
