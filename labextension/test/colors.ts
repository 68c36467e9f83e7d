import { ThemeColors } from '../src/theme';

/** Distinct colors per role, so a test sees which role a chart used. */
export const TEST_COLORS: ThemeColors = {
  font: '#010101',
  muted: '#020202',
  grid: '#030303',
  family: 'serif',
  error: '#f00000',
  peak: '#000000',
  region: '#0000f0',
  marker: '#f0a000'
};
